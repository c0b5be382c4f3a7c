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
    import json
    import tempfile
    from pathlib import Path

    from trace_core.tracking import MLflowTracker, TrackingConfig
    from trace_core.training.profiler import PHASES

    summary = json.loads((Path(trained.path) / "summary.json").read_text())
    method, run_id = trained.metadata["method"], trained.metadata["run_id"]
    shares = {p: float(summary["cost_fractions"].get(p, 0.0)) for p in PHASES}
    final = summary.get("final", {})
    step_s = float(final.get("cost/step_s", float("nan")))
    lines = [f"### Cost breakdown: {method} ({summary['steps']} steps)", "", "| phase | share |", "|---|---:|"]
    lines += [f"| {p} | {100 * s:.1f}% |" for p, s in shares.items()]
    text = "\n".join(lines) + "\n\n```\n" + (Path(trained.path) / "cost_breakdown.txt").read_text() + "```\n"
    Path(breakdown.path).write_text(text)
    import yaml

    history = json.loads((Path(trained.path) / "history.json").read_text())
    means = {k: sum(v) / len(v) for k, v in history.items() if v}
    train_cfg = yaml.safe_load((Path(trained.path) / "train_config.yaml").read_text())
    allocations = [json.loads(f.read_text()) for f in sorted((Path(trained.path) / "allocations").glob("*.json"))]
    data = {"method": method, "run_id": run_id, "steps": summary["steps"], "cost_shares": shares,
            "last_step_seconds": step_s, "final": final, "means": means, "history": history,
            "pool_success": summary.get("pool_success") or [], "warmup": summary.get("warmup"),
            "pool_samples": train_cfg["pool_success"]["samples"], "allocations": allocations,
            "evaluation": json.loads(Path(evaluation.path).read_text()), "score": evaluation.metadata["score"],
            "primary_metric": evaluation.metadata["primary_metric"]}
    Path(report.path).write_text(json.dumps(data, indent=1, default=float))
    report.metadata.update({"method": method, "run_id": run_id, "fingerprint": evaluation.metadata["fingerprint"],
                            "dvc_md5": trained.metadata.get("dvc_md5", "")})
    (Path(workspace) / "profile").mkdir(parents=True, exist_ok=True)
    spool = Path(tempfile.mkdtemp(prefix=f"{method}-", dir=Path(workspace) / "profile"))
    (spool / "cost_breakdown.md").write_text(text)
    # A fixed timestamp (the summary's): profiling the same run again logs exact duplicates, which MLflow drops.
    stamp = int((Path(trained.path) / "summary.json").stat().st_mtime * 1000)
    tracker = MLflowTracker(TrackingConfig(tracking_uri=tracking_uri, experiment=experiment,
                                           spool_dir=str(spool / "spool")), run_id=run_id)
    tracker.log_metrics({f"profile/{p}_share": s for p, s in shares.items()}, step=0, timestamp=stamp)
    tracker.log_artifact(spool / "cost_breakdown.md", "profile")
    tracker.flush()
