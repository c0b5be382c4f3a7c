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

    Three parts: the learning signal per rollout (``trace_core.training.summary.training_table``:
    ratios pooled over the steps with 90% Wilson intervals, pool success, held-out evaluation,
    rollouts with and without the predictor's warm-up), the cost view, and the evaluation view
    (``trace_core.evaluation.comparison_table``, the paper's main-table layout)."""
    import json
    import math
    from pathlib import Path

    from trace_core.evaluation import EvalResult, comparison_table
    from trace_core.lineage import StageCache, fingerprint, lineage_tags
    from trace_core.tracking import MLflowTracker, TrackingConfig
    from trace_core.training.plots import comparison_plots
    from trace_core.training.summary import run_figures, training_table

    loaded = {}
    for artifact in reports:
        data = json.loads(Path(artifact.path).read_text())
        loaded[data["method"]] = (data, artifact.metadata)
    missing = [m for m in methods if m not in loaded]
    if missing:
        raise ValueError(f"no report for methods {missing}; got {sorted(loaded)}")
    fp = fingerprint("compare", [loaded[m][1]["fingerprint"] for m in methods], methods)
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup("compare", fp)

    def fmt(value, percent=False):
        if value is None or not math.isfinite(value):
            return "–"
        return f"{100 * value:.1f}" if percent else f"{value:.3f}"

    if record is None:
        work = cache.start("compare", fp)
        first = loaded[methods[0]][0]
        metric = first["primary_metric"]
        label = "pass@1" if metric == "pass_at_1" else metric
        runs = [run_figures(m, loaded[m][0]["history"], loaded[m][0]["pool_success"], loaded[m][0]["warmup"],
                            loaded[m][0]["pool_samples"]) for m in methods]
        head = ["Method", "s/step", "rollout share", "policy opt. share", "predictor share", "MLflow run"]
        cost = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
        for m in methods:
            d = loaded[m][0]
            shares = d["cost_shares"]
            pred = shares.get("predictor_scoring", 0.0) + shares.get("predictor_update", 0.0)
            cost.append("| " + " | ".join([m, fmt(d["means"].get("cost/step_s")), fmt(shares.get("rollout"), True),
                                           fmt(shares.get("policy_optimisation"), True), fmt(pred, True),
                                           d["run_id"][:12]]) + " |")
        lines = ["### Learning signal per rollout (pooled over the training steps)", "",
                 training_table(runs, {m: loaded[m][0]["score"] for m in methods},
                                f"held-out {label} (%)"), "",
                 "### Cost", "", *cost]
        results = {m: EvalResult.from_json(loaded[m][0]["evaluation"]) for m in methods}
        text = "\n".join(lines) + "\n\n### Evaluation\n\n" + comparison_table(results)
        (work / "compare.md").write_text(text)
        (work / "compare.json").write_text(json.dumps({m: loaded[m][0] for m in methods}, indent=1, default=float))
        tracker = MLflowTracker(
            TrackingConfig(tracking_uri=tracking_uri, experiment=experiment, run_name="compare",
                           spool_dir=str(work / "spool")),
            tags={"pipeline.step": "compare", "compare.methods": ",".join(methods),
                  **{f"compare.run.{m}": loaded[m][0]["run_id"] for m in methods},
                  **lineage_tags(dvc_data_hash=loaded[methods[0]][1].get("dvc_md5", ""), kfp_run_id=kfp_run_id,
                                 config=methods)})
        metrics = {}
        for m, r in zip(methods, runs, strict=True):
            d = loaded[m][0]
            metrics[f"{m}/eval_score"] = d["score"]
            metrics[f"{m}/effective_ratio"] = r.effective_ratio
            metrics[f"{m}/contrastive_yield"] = r.contrastive_yield
            metrics[f"{m}/rollouts_per_mixed_group"] = r.rollouts_per_mixed_group
            metrics[f"{m}/pool_success_end"] = r.pool_success_end
            metrics[f"{m}/seconds_per_step"] = d["means"].get("cost/step_s", float("nan"))
        tracker.log_metrics(metrics, step=0)
        tracker.log_artifact(work / "compare.md")
        tracker.log_artifact(work / "compare.json")
        # The plots: one per comparison, in MLflow and in the workspace's plots/ folder.
        varying = {m: loaded[m][0]["allocations"] for m in methods
                   if any(len({x for x in a["m"] if x}) > 1 for a in loaded[m][0]["allocations"])}
        figures = comparison_plots({m: loaded[m][0]["history"] for m in methods}, varying)
        (work / "plots").mkdir(exist_ok=True)
        for name, fig in figures.items():
            fig.savefig(work / "plots" / f"{name}.png", dpi=110)
            tracker.log_artifact(work / "plots" / f"{name}.png", "plots")
        tracker.close()
        record = cache.commit("compare", fp, {"run_id": tracker.run_id,
                                              "training_runs": {m: loaded[m][0]["run_id"] for m in methods}})
    text = (cache.entry("compare", fp) / "compare.md").read_text()
    Path(table.path).write_text(text)
    plots = sorted(str(p) for p in (cache.entry("compare", fp) / "plots").glob("*.png"))
    table.metadata.update({"fingerprint": fp, "run_id": record["run_id"], "training_runs": record["training_runs"]})
    return json.dumps({"table": text, "compare_run": record["run_id"], "training_runs": record["training_runs"],
                       "plots": plots})
