"""profile: the cost breakdown of a training run — where the wall time went, per phase (method §7)."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def profile(
    trained: Input[Model],
    evaluation: Input[Artifact],
    tracking_uri: str,
    experiment: str,
    workspace: str,
    report: Output[Artifact],
    breakdown: Output[Markdown],
):
    """Turn the trainer's per-phase seconds into the cost table (shares of rollout, tool execution,
    predictor scoring and update, policy optimisation, weight sync, checkpointing, logging), log it
    to the training run (``profile/<phase>_share`` metrics and ``cost_breakdown.md``), and write the
    method's report for ``compare``: final training metrics, cost shares, the evaluation result."""
    from pipelines.steps.artifacts import ArtifactRef
    from pipelines.steps.profile import run_profile

    made = run_profile(ArtifactRef.of(trained), ArtifactRef.of(evaluation), tracking_uri, experiment, workspace,
                       report.path, breakdown.path)
    report.metadata.update(made.metadata.to_dict())
