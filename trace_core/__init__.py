"""trace_core — the TRACE library: rollout trees, exact budgeted allocation, tree-aware advantages,
metrics and a simulator. Pure Python/numpy at its heart; no Kubeflow, MLflow or DVC imports."""

__version__ = "0.1.0"
