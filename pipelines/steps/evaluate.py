"""evaluate: a trained policy on held-out benchmarks; the metrics go to its training run."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.lineage import StageCache, closure_digest, copy_tree, fingerprint
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext


@dataclass(frozen=True)
class Evaluated:
    """What evaluate made: the score, its metric and family, and the result artifact's metadata."""

    score: float  # the train family's average of the primary metric (NaN when it was not measured)
    primary_metric: str  # e.g. pass_at_1
    family: str  # the train task family (math, qa, fc)
    metadata: ArtifactMetadata  # fingerprint, method, run_id, score, primary_metric


def run_evaluate(trained: ArtifactRef, data: ArtifactRef, index: ArtifactRef, step: dict[str, Any],
                 train_cfg: dict[str, Any], ctx: StepContext, out: str) -> Evaluated:
    """Evaluate ``trained/policy`` (``step``: the ``evaluate`` section, ``train_cfg``: the
    TrainConfig JSON, whose agent limits and environments the evaluation uses), log ``eval/...``
    into the training run and write the result JSON to ``out``."""
    from trace_core.evaluation import FAMILY_DEFAULTS

    method, run_id = trained.metadata.method, trained.metadata.run_id
    family = train_cfg["task"]["family"]
    names = step["benchmarks"] or list(FAMILY_DEFAULTS[family])
    fp = fingerprint("evaluate", trained.metadata.fingerprint, index.metadata.fingerprint, step, names,
                     train_cfg["agent"], train_cfg["task"]["envs"], closure_digest(__name__))
    stage = f"evaluate-{method}"
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(stage, fp)
    if record is None:
        work = cache.start(stage, fp)
        score, primary = _evaluate(trained, data, index, step, train_cfg, names, ctx, work)
        record = cache.commit(stage, fp, {"score": score, "primary_metric": primary, "run_id": run_id})
    copy_tree(cache.entry(stage, fp) / "eval" / "result.json", out)
    score = float(record["score"])
    return Evaluated(score, record["primary_metric"], family,
                     ArtifactMetadata(fingerprint=fp, method=method, run_id=run_id, score=score,
                                      primary_metric=record["primary_metric"]))


def _evaluate(trained: ArtifactRef, data: ArtifactRef, index: ArtifactRef, step: dict[str, Any],
              train_cfg: dict[str, Any], names: list[str], ctx: StepContext, work: Path) -> tuple[float, str]:
    """Run the evaluation into ``work/eval`` and the training run; (score, primary metric)."""
    from trace_core.config import from_dict
    from trace_core.evaluation import EvalConfig
    from trace_core.evaluation import evaluate as run_evaluation
    from trace_core.tracking import MLflowTracker, TrackingConfig

    method, run_id = trained.metadata.method, trained.metadata.run_id
    family = train_cfg["task"]["family"]
    from trace_core.envs.families import family_names, get_family

    envs = copy.deepcopy(train_cfg["task"]["envs"])  # the caller's JSON stays as it was
    for name in family_names():  # every family that reads a retriever index reads the pipeline's
        spec = get_family(name)
        if spec.needs_index and spec.section in envs:
            envs[spec.section]["index_dir"] = index.path
    engine = train_cfg["engine"]
    config = from_dict(EvalConfig, {
        "name": method,
        "benchmarks": [{"name": n, "max_examples": step["max_examples"] or None} for n in names],
        "data_dir": data.path, "samples": step["samples"], "greedy": step["greedy"], "seed": step["seed"],
        "agents": {family: train_cfg["agent"]}, "envs": envs,
        "engine": {"kind": step["engine_kind"], "dtype": engine["dtype"], "max_model_len": engine["max_model_len"],
                   "block_size": engine["block_size"], "kv_cache_mb": engine["kv_cache_mb"]},
        "output_dir": str(work / "eval"), "metric_prefix": "eval/",
    })
    # Into the training run (its own spool: a spool belongs to one run).
    tracker = MLflowTracker(TrackingConfig(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment,
                                           spool_dir=str(work / "spool")), run_id=run_id)
    res = run_evaluation(str(Path(trained.path) / "policy"), config, tracker=tracker)
    score = res.averages.get(f"{family}/all/{res.primary_metric}", float("nan"))
    tracker.log_metrics({"eval/score": score}, step=0)
    tracker.flush()
    return score, res.primary_metric
