"""compare: the methods side by side — evaluation, learning signal, cost — as one table in MLflow."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.lineage import StageCache, closure_digest, fingerprint, lineage_tags
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext

if TYPE_CHECKING:
    from trace_core.tracking import Tracker

STAGE = "compare"
COST_HEAD = ("Method", "s/step", "rollout share", "policy opt. share", "predictor share", "MLflow run")


@dataclass(frozen=True)
class Comparison:
    """What compare made: the table, its MLflow run, the training runs it compares, its plots."""

    table: str  # the comparison (markdown): learning signal, cost, evaluation
    compare_run: str  # the compare step's MLflow run
    training_runs: dict[str, str]  # method -> its training run
    plots: list[str]  # the plot files (PNG), sorted
    metadata: ArtifactMetadata  # the table artifact's: fingerprint, run_id, training_runs


def _fmt(value: float | None, percent: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:.1f}" if percent else f"{value:.3f}"


def cost_lines(reports: dict[str, dict[str, Any]], methods: list[str]) -> list[str]:
    """The cost table (markdown lines): seconds per step and the main phases' shares per method."""
    lines = ["| " + " | ".join(COST_HEAD) + " |", "|---|" + "---:|" * (len(COST_HEAD) - 2) + "---|"]
    for m in methods:
        d = reports[m]
        shares = d["cost_shares"]
        pred = shares.get("predictor_scoring", 0.0) + shares.get("predictor_update", 0.0)
        lines.append("| " + " | ".join([m, _fmt(d["means"].get("cost/step_s")), _fmt(shares.get("rollout"), True),
                                        _fmt(shares.get("policy_optimisation"), True), _fmt(pred, True),
                                        d["run_id"][:12]]) + " |")
    return lines


def run_compare(reports: list[ArtifactRef], methods: list[str], ctx: StepContext, out: str) -> Comparison:
    """Build the comparison of the methods' profile reports (in ``methods`` order), write it to
    ``out`` and log it to an MLflow run of its own (the component's docstring lists what)."""
    loaded = {}
    for artifact in reports:
        data = json.loads(Path(artifact.path).read_text())
        loaded[data["method"]] = (data, artifact.metadata)
    missing = [m for m in methods if m not in loaded]
    if missing:
        raise ValueError(f"no report for methods {missing}; got {sorted(loaded)}")
    fp = fingerprint(STAGE, [loaded[m][1].fingerprint for m in methods], methods, closure_digest(__name__))
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(STAGE, fp)
    if record is None:
        record = _compare(loaded, methods, ctx, cache, fp)
    text = (cache.entry(STAGE, fp) / "compare.md").read_text()
    Path(out).write_text(text)
    plots = sorted(str(p) for p in (cache.entry(STAGE, fp) / "plots").glob("*.png"))
    return Comparison(text, record["run_id"], record["training_runs"], plots,
                      ArtifactMetadata(fingerprint=fp, run_id=record["run_id"], training_runs=record["training_runs"]))


def _compare(loaded: dict[str, tuple[dict[str, Any], dict[str, Any]]], methods: list[str], ctx: StepContext,
             cache: StageCache, fp: str) -> dict[str, Any]:
    """Write compare.md, compare.json and the plots into a new cache entry and log them; its record."""
    from trace_core.evaluation import EvalResult, comparison_table
    from trace_core.tracking import MLflowTracker, TrackingConfig
    from trace_core.training.summary import run_figures, training_reading, training_table

    work = cache.start(STAGE, fp)
    reports = {m: loaded[m][0] for m in methods}
    metric = reports[methods[0]]["primary_metric"]
    label = "pass@1" if metric == "pass_at_1" else metric
    runs = [run_figures(m, reports[m]["history"], reports[m]["pool_success"], reports[m]["warmup"],
                        reports[m]["pool_samples"]) for m in methods]
    lines = ["### Learning signal per rollout, per generated token and per rollout second (pooled over the "
             "training steps)", "",
             training_table(runs, {m: reports[m]["score"] for m in methods}, f"held-out {label} (%)"), "",
             training_reading(runs), "",
             "### Cost", "", *cost_lines(reports, methods)]
    results = {m: EvalResult.from_json(reports[m]["evaluation"]) for m in methods}
    text = "\n".join(lines) + "\n\n### Evaluation\n\n" + comparison_table(results)
    (work / "compare.md").write_text(text)
    (work / "compare.json").write_text(json.dumps(reports, indent=1, default=float))
    tracker = MLflowTracker(
        TrackingConfig(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment, run_name=STAGE,
                       spool_dir=str(work / "spool")),
        tags={"pipeline.step": STAGE, "compare.methods": ",".join(methods),
              **{f"compare.run.{m}": reports[m]["run_id"] for m in methods},
              **lineage_tags(dvc_data_hash=loaded[methods[0]][1].dvc_md5, kfp_run_id=ctx.kfp_run_id,
                             config=methods)})
    metrics = {}
    for m, r in zip(methods, runs, strict=True):
        metrics[f"{m}/eval_score"] = reports[m]["score"]
        metrics[f"{m}/effective_ratio"] = r.effective_ratio
        metrics[f"{m}/contrastive_yield"] = r.contrastive_yield
        metrics[f"{m}/rollouts_per_mixed_group"] = r.rollouts_per_mixed_group
        metrics[f"{m}/mixed_per_1k_tokens"] = r.mixed_per_1k_tokens
        metrics[f"{m}/contrastive_per_1k_tokens"] = r.contrastive_per_1k_tokens
        metrics[f"{m}/mixed_per_rollout_s"] = r.mixed_per_rollout_s
        metrics[f"{m}/pool_success_end"] = r.pool_success_end
        metrics[f"{m}/seconds_per_step"] = reports[m]["means"].get("cost/step_s", float("nan"))
    tracker.log_metrics(metrics, step=0)
    tracker.log_artifact(work / "compare.md")
    tracker.log_artifact(work / "compare.json")
    _plots(reports, methods, work, tracker)
    tracker.close()
    return cache.commit(STAGE, fp, {"run_id": tracker.run_id,
                                    "training_runs": {m: reports[m]["run_id"] for m in methods}})


def _plots(reports: dict[str, dict[str, Any]], methods: list[str], work: Path, tracker: Tracker) -> None:
    """The plots: one per comparison, in MLflow and in the entry's plots/ folder (the effective
    ratio per step per method; for each method whose roots vary, its m_i histogram and K by
    relative turn position)."""
    from trace_core.training.plots import comparison_plots

    varying = {m: reports[m]["allocations"] for m in methods
               if any(len({x for x in a["m"] if x}) > 1 for a in reports[m]["allocations"])}
    figures = comparison_plots({m: reports[m]["history"] for m in methods}, varying)
    (work / "plots").mkdir(exist_ok=True)
    for name, fig in figures.items():
        fig.savefig(work / "plots" / f"{name}.png", dpi=110)
        tracker.log_artifact(work / "plots" / f"{name}.png", "plots")
