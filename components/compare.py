"""compare: the methods side by side — evaluation, learning signal, cost — as one table in MLflow."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Markdown, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def compare(
    reports: Input[list[Artifact]],
    methods: list[str],
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    table: Output[Markdown],
) -> str:
    """Build the comparison table of the methods' profile reports (in ``methods`` order) and log it
    to an MLflow run of its own (``compare.md``, ``compare.json``, per-method metrics, and the
    training runs' ids as tags) and its plots (``plots/``: the effective ratio per step per method;
    for each method whose roots vary, its ``m_i`` histogram and ``K`` by relative turn position).
    Returns JSON: ``table`` (markdown), ``compare_run``, ``training_runs`` (method -> MLflow run
    id) and ``plots`` (the files).

    Three parts: the learning signal per rollout, per generated token and per rollout second
    (``trace_core.training.summary.training_table``: ratios pooled over the steps with 90% Wilson
    intervals, mixed groups per 1,000 generated tokens and per second of rollout wall time with
    90% Poisson score intervals, pool success, held-out evaluation, rollouts with and without the
    predictor's warm-up), the cost view, and the evaluation view
    (``trace_core.evaluation.comparison_table``, the paper's main-table layout)."""
    import json

    from pipelines.steps.artifacts import ArtifactRef, StepContext
    from pipelines.steps.compare import run_compare

    ctx = StepContext(workspace, reuse, tracking_uri, experiment, kfp_run_id)
    made = run_compare([ArtifactRef.of(r) for r in reports], methods, ctx, table.path)
    table.metadata.update(made.metadata.to_dict())
    return json.dumps({"table": made.table, "compare_run": made.compare_run, "training_runs": made.training_runs,
                       "plots": made.plots})
