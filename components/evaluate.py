"""evaluate: a trained policy on held-out benchmarks; the metrics go to its training run."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def evaluate(
    trained: Input[Model],
    data: Input[Dataset],
    index: Input[Artifact],
    eval_config: str,
    train_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    result: Output[Artifact],
    metrics: Output[Metrics],
) -> float:
    """Evaluate ``trained/policy`` with ``trace_core.evaluation`` and return its score: the train
    family's average of the primary metric (pass@1 averaged over k samples).

    The evaluation runs with the training run's agent limits and environment settings, and logs
    ``eval/...`` metrics and files into the *training* MLflow run, so that one run holds how the
    policy was trained and how well it does."""
    import json
    import math
    from pathlib import Path

    from trace_core.config import from_dict
    from trace_core.evaluation import FAMILY_DEFAULTS, EvalConfig
    from trace_core.evaluation import evaluate as run_evaluation
    from trace_core.lineage import StageCache, code_digest, copy_tree, fingerprint
    from trace_core.tracking import MLflowTracker, TrackingConfig

    step, train_cfg = json.loads(eval_config), json.loads(train_config)
    method, run_id = trained.metadata["method"], trained.metadata["run_id"]
    family = train_cfg["task"]["family"]
    names = step["benchmarks"] or list(FAMILY_DEFAULTS[family])
    fp = fingerprint("evaluate", trained.metadata["fingerprint"], index.metadata["fingerprint"], step, names,
                     train_cfg["agent"], train_cfg["task"]["envs"],
                     code_digest("trace_core.evaluation", "trace_core.rollout", "trace_core.envs"))
    stage = f"evaluate-{method}"
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup(stage, fp)
    if record is None:
        work = cache.start(stage, fp)
        envs = train_cfg["task"]["envs"]
        envs["qa"]["index_dir"] = index.path
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
        tracker = MLflowTracker(TrackingConfig(tracking_uri=tracking_uri, experiment=experiment,
                                               spool_dir=str(work / "spool")), run_id=run_id)
        res = run_evaluation(str(Path(trained.path) / "policy"), config, tracker=tracker)
        score = res.averages.get(f"{family}/all/{res.primary_metric}", float("nan"))
        tracker.log_metrics({"eval/score": score}, step=0)
        tracker.flush()
        record = cache.commit(stage, fp, {"score": score, "primary_metric": res.primary_metric, "run_id": run_id})
    copy_tree(cache.entry(stage, fp) / "eval" / "result.json", result.path)
    score = float(record["score"])
    result.metadata.update({"fingerprint": fp, "method": method, "run_id": run_id, "score": score,
                            "primary_metric": record["primary_metric"]})
    if math.isfinite(score):
        metrics.log_metric(f"{family}_{record['primary_metric']}", score)
    return score
