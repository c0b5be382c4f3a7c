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
    training runs' ids as tags). Returns JSON: ``table`` (markdown), ``compare_run`` and
    ``training_runs`` (method -> MLflow run id).

    Two parts: the training and cost view (mean effective ratio over the steps — the share of
    groups with both a success and a failure, SPEC §7 —, prefix effective ratio, mean reward,
    seconds per step, the largest cost shares) and the evaluation view
    (``trace_core.evaluation.comparison_table``, the paper's main-table layout)."""
    import json
    import math
    from pathlib import Path

    from trace_core.evaluation import EvalResult, comparison_table
    from trace_core.lineage import StageCache, fingerprint, lineage_tags
    from trace_core.tracking import MLflowTracker, TrackingConfig

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
        head = ["Method", f"eval {label} (%)", "effective ratio", "prefix eff. ratio", "reward", "s/step",
                "rollout share", "policy opt. share", "predictor share", "MLflow run"]
        lines = ["### Training and cost (means over the training steps)", "",
                 "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
        for m in methods:
            d = loaded[m][0]
            means, shares = d["means"], d["cost_shares"]
            pred = shares.get("predictor_scoring", 0.0) + shares.get("predictor_update", 0.0)
            cells = [m, fmt(d["score"], True), fmt(means.get("effective_ratio")),
                     fmt(means.get("prefix_effective_ratio")), fmt(means.get("reward/mean")),
                     fmt(means.get("cost/step_s")), fmt(shares.get("rollout"), True),
                     fmt(shares.get("policy_optimisation"), True), fmt(pred, True), d["run_id"][:12]]
            lines.append("| " + " | ".join(cells) + " |")
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
        for m in methods:
            d = loaded[m][0]
            metrics[f"{m}/eval_score"] = d["score"]
            metrics[f"{m}/effective_ratio"] = d["means"].get("effective_ratio", float("nan"))
            metrics[f"{m}/seconds_per_step"] = d["means"].get("cost/step_s", float("nan"))
        tracker.log_metrics(metrics, step=0)
        tracker.log_artifact(work / "compare.md")
        tracker.log_artifact(work / "compare.json")
        tracker.close()
        record = cache.commit("compare", fp, {"run_id": tracker.run_id,
                                              "training_runs": {m: loaded[m][0]["run_id"] for m in methods}})
    text = (cache.entry("compare", fp) / "compare.md").read_text()
    Path(table.path).write_text(text)
    table.metadata.update({"fingerprint": fp, "run_id": record["run_id"], "training_runs": record["training_runs"]})
    return json.dumps({"table": text, "compare_run": record["run_id"], "training_runs": record["training_runs"]})
