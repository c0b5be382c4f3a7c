"""The trace-rl Kubeflow pipeline: configuration (config.py), the DAG (dag.py), the work of each
step (steps/), lineage tags and the reuse cache (lineage.py), the model registry (registry.py),
Kubernetes placement (platform.py), the multi-node PyTorchJob (pytorchjob.py), the local runner
(local.py), DVC stages (stages.py) and the command line (``python -m pipelines --help``)."""
