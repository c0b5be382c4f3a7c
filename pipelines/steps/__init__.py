"""The work of each pipeline step, one module per step: what the components of ``components/``
run. Each step is a plain function over typed values (:mod:`pipelines.steps.artifacts`): the
input artifacts as :class:`ArtifactRef` (a path and its producer's metadata), the section of
:class:`~pipelines.config.PipelineConfig` it reads (the JSON the pipeline passed, as a dict:
that dict is what the step's fingerprint hashes), where it keeps and logs its results
(:class:`StepContext`), and the paths of its outputs; it returns a dataclass of what it made.

A component unpacks KFP's artifacts into these values, calls its step and writes the result's
metadata back, so the DAG's steps can be run, read and tested without KFP.
"""
