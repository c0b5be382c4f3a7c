"""What every benchmark shares, so that no benchmark reads another's internals.

- **Provenance** (:class:`Provenance`): the commit a figure was measured at and whether the
  checkout differed from it — tracked changes and untracked files anywhere in the repository, the
  benchmarks' own records under ``bench/results/`` excepted (they are what a run writes, not what
  it runs). Taken once, when a benchmark starts: the code a run executes is the code it loaded then.
- **Records** (:func:`write_json`): a results file is written whole or not at all.
- **Run folders** (:func:`claim_run_folder`): a run resumes only in a folder made by the same
  commit and settings.
- **The engine runs share** (:class:`SharedEngine`), **the method variants** the learning
  benchmarks run (:data:`VARIANTS`), and **verdicts** (:func:`verdict`): a target's PASS or MISS
  beside the figure it was judged on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# What a benchmark writes, never what it runs: left out of the dirty check.
OUTPUTS = ("bench/results",)

# name -> (registry method, predictor warm-up?); informed wherever the method reads the predictor
VARIANTS = {"grpo": ("grpo", False), "pcl": ("pcl", True), "treepo": ("treepo", False), "trace": ("trace", True),
            "trace-cold": ("trace", False), "trace-root-only": ("trace-root-only", True),
            "trace-prefix-only": ("trace-prefix-only", True), "greso": ("greso", False), "dapo": ("dapo", False),
            "dapo-capped": ("dapo-capped", False),
            "trace-posterior": ("trace-posterior", True),
            "trace-posterior-thompson": ("trace-posterior-thompson", True),
            "vip": ("vip", True), "trace-tokens": ("trace-tokens", True),
            "knapsack-rl": ("knapsack-rl", False), "arpo": ("arpo", False)}


def git_commit() -> str | None:
    """The checked-out commit (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=REPO)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def tree_is_dirty() -> bool:
    """Whether the checkout differs from its commit: a tracked file changed, or a file git does not
    ignore is untracked, anywhere but the benchmarks' records. True where git cannot tell."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", ".",
                              *(f":(exclude){path}" for path in OUTPUTS)],
                             capture_output=True, text=True, check=True, cwd=REPO)
    except (OSError, subprocess.CalledProcessError):
        return True
    return bool(out.stdout.strip())


@dataclass(frozen=True)
class Provenance:
    """Where a benchmark's figures come from: the commit, and whether the checkout differed from it."""

    commit: str | None
    dirty: bool

    @classmethod
    def now(cls) -> Provenance:
        """The checkout as it is: call once when the benchmark starts."""
        return cls(git_commit(), tree_is_dirty())

    def label(self) -> str:
        return f"{self.commit}{' (dirty)' if self.dirty else ''}"


def write_json(path: Path, data: dict) -> None:
    """Whole or absent: written beside, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float) + "\n")
    os.replace(tmp, path)


def claim_run_folder(out: Path, commit: str | None, settings: dict) -> None:
    """Keep ``out`` when it holds a run of this commit and these settings (it resumes from its
    checkpoint); otherwise empty it and mark it as theirs."""
    started = out / "bench_settings.json"
    if not (started.is_file() and json.loads(started.read_text()) == {"commit": commit, "settings": settings}):
        shutil.rmtree(out, ignore_errors=True)  # another run's folder: start over
        out.mkdir(parents=True)
        started.write_text(json.dumps({"commit": commit, "settings": settings}))


def process_tree_sum(read: Callable[[Any], float]) -> float:
    """``read(process)`` summed over this process and all its children (psutil processes): their
    resident memory, their bytes written. A child that ends between the listing and the read adds
    nothing."""
    import psutil

    me = psutil.Process(os.getpid())
    try:
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:
        procs = [me]
    total = 0.0
    for p in procs:
        try:
            total += read(p)
        except (psutil.Error, AttributeError):
            continue
    return total


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Lay out ``fig``, write it to ``path`` and free it (a benchmark draws one figure per record)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def verdict(holds: bool, figure: str = "") -> str:
    """A target's verdict as the tables write it: ``PASS`` or ``MISS``, then the figure judged."""
    return ("PASS" if holds else "MISS") + (f" {figure}" if figure else "")


@dataclass(frozen=True)
class CurveRun:
    """One run's curves for :func:`log_benchmark_table`: a nested MLflow run named ``name`` with
    ``params``, each curve a metric whose step is its cost (rounded), and ``metrics`` beside."""

    name: str
    params: dict[str, Any]
    curves: dict[str, tuple[Any, Any]]  # metric name -> (costs, values)
    metrics: dict[str, float] = field(default_factory=dict)


def log_benchmark_table(uri: str, experiment_name: str, run_name: str, table: Path, figure: Path,
                        summary: dict[str, float], runs: list[CurveRun]) -> str:
    """Log a benchmark's table to the MLflow tracking server at ``uri``: one parent run with the
    ``summary`` metrics, the table and its plot as artifacts, and one nested run per
    :class:`CurveRun`, so the UI overlays the curves. The parent run is tagged with the table's
    digest: logging the same table twice logs it once (returns that run's id either way)."""
    import hashlib

    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    experiment = mlflow.set_experiment(experiment_name)
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
    logged = MlflowClient(uri).search_runs([experiment.experiment_id],
                                           f"tags.table_digest = '{digest}' and attributes.status = 'FINISHED'")
    if logged:
        print(f"mlflow: this table is logged already (run {logged[0].info.run_id})")
        return logged[0].info.run_id
    with mlflow.start_run(run_name=run_name, tags={"table_digest": digest}) as parent:
        mlflow.log_metrics({k: float(v) for k, v in summary.items()})
        mlflow.log_artifact(str(table))
        if figure.is_file():
            mlflow.log_artifact(str(figure))
        for run in runs:
            with mlflow.start_run(run_name=run.name, nested=True):
                mlflow.log_params(run.params)
                for name, (costs, values) in run.curves.items():
                    for at, value in zip(costs, values, strict=True):
                        mlflow.log_metric(name, float(value), step=int(round(float(at))))
                if run.metrics:
                    mlflow.log_metrics({k: float(v) for k, v in run.metrics.items()})
    print(f"mlflow: logged the table and {len(runs)} curves to {uri} (run {parent.info.run_id})")
    return parent.info.run_id


class SharedEngine:
    """The one vLLM engine every run shares, started by the first run that needs it (a rerun whose
    runs all have records starts none)."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._engine = None

    def get(self):
        if self._engine is None:
            import torch

            from trace_core.rollout.engine import EngineConfig
            from trace_core.rollout.vllm_engine import VLLMEngine

            torch.set_num_threads(1)
            self._engine = VLLMEngine(EngineConfig(model_path=self.policy, max_model_len=2048,
                                                   kv_cache_bytes=256 << 20))
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
