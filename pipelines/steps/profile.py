"""profile: the cost breakdown of a training run — where the wall time went, per phase (method §7)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef


@dataclass(frozen=True)
class Profiled:
    """What profile made: the report artifact's metadata."""

    metadata: ArtifactMetadata  # method, run_id, fingerprint (the evaluation's), dvc_md5


def cost_table(method: str, steps: int, shares: dict[str, float], breakdown: str) -> str:
    """The markdown cost table of one training run: each phase's share, then the trainer's breakdown."""
    lines = [f"### Cost breakdown: {method} ({steps} steps)", "", "| phase | share |", "|---|---:|"]
    lines += [f"| {p} | {100 * s:.1f}% |" for p, s in shares.items()]
    return "\n".join(lines) + "\n\n```\n" + breakdown + "```\n"


def run_profile(trained: ArtifactRef, evaluation: ArtifactRef, tracking_uri: str, experiment: str, workspace: str,
                report_out: str, breakdown_out: str) -> Profiled:
    """Write the cost table to ``breakdown_out`` and the method's report for compare to
    ``report_out`` (final training metrics, cost shares, the evaluation result); log the shares
    (``profile/<phase>_share``) and ``cost_breakdown.md`` to the training run."""
    import yaml

    from trace_core.tracking import MLflowTracker, TrackingConfig
    from trace_core.training.profiler import PHASES

    folder = Path(trained.path)
    summary = json.loads((folder / "summary.json").read_text())
    method, run_id = trained.metadata.method, trained.metadata.run_id
    shares = {p: float(summary["cost_fractions"].get(p, 0.0)) for p in PHASES}
    final = summary.get("final", {})
    step_s = float(final.get("cost/step_s", float("nan")))
    text = cost_table(method, summary["steps"], shares, (folder / "cost_breakdown.txt").read_text())
    Path(breakdown_out).write_text(text)
    history = json.loads((folder / "history.json").read_text())
    means = {k: sum(v) / len(v) for k, v in history.items() if v}
    train_cfg = yaml.safe_load((folder / "train_config.yaml").read_text())
    allocations = [json.loads(f.read_text()) for f in sorted((folder / "allocations").glob("*.json"))]
    data = {"method": method, "run_id": run_id, "steps": summary["steps"], "cost_shares": shares,
            "last_step_seconds": step_s, "final": final, "means": means, "history": history,
            "pool_success": summary.get("pool_success") or [], "warmup": summary.get("warmup"),
            "pool_samples": train_cfg["pool_success"]["samples"], "allocations": allocations,
            "evaluation": json.loads(Path(evaluation.path).read_text()), "score": evaluation.metadata.score,
            "primary_metric": evaluation.metadata.primary_metric}
    Path(report_out).write_text(json.dumps(data, indent=1, default=float))
    (Path(workspace) / "profile").mkdir(parents=True, exist_ok=True)
    spool = Path(tempfile.mkdtemp(prefix=f"{method}-", dir=Path(workspace) / "profile"))
    (spool / "cost_breakdown.md").write_text(text)
    # A fixed timestamp (the summary's): profiling the same run again logs exact duplicates, which MLflow drops.
    stamp = int((folder / "summary.json").stat().st_mtime * 1000)
    tracker = MLflowTracker(TrackingConfig(tracking_uri=tracking_uri, experiment=experiment,
                                           spool_dir=str(spool / "spool")), run_id=run_id)
    tracker.log_metrics({f"profile/{p}_share": s for p, s in shares.items()}, step=0, timestamp=stamp)
    tracker.log_artifact(spool / "cost_breakdown.md", "profile")
    tracker.flush()
    return Profiled(ArtifactMetadata(method=method, run_id=run_id, fingerprint=evaluation.metadata.fingerprint,
                                     dvc_md5=trained.metadata.dvc_md5))
