"""``run --local``: the same DAG on this machine with ``kfp.local``'s subprocess runner.

Every task runs in a subprocess of this venv's interpreter (``SubprocessRunner(use_venv=False)``:
``trace_core`` is installed here, nothing is pip-installed), one at a time. Paths in the
configuration are made absolute first, so the tasks agree on them. KFP's own output (each
task's executor input and logs) goes to ``<workspace>/logs/<time>.log``; the console shows one
line per task. What is up to date is reused by the components themselves
(:class:`pipelines.lineage.StageCache` under the workspace): ``kfp.local`` has no cache.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines.config import PipelineConfig

REPO = Path(__file__).resolve().parents[1]
_SHOW = re.compile(r"(Executing task|finished with status|Pipeline .* finished| - ERROR - |progress: )")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class LocalRun:
    """What a local run produced."""

    table: str  # the comparison table (markdown)
    training_runs: dict[str, str]  # method -> MLflow run id
    compare_run: str  # the compare step's MLflow run
    tracking_uri: str
    experiment: str
    experiment_id: str
    log: Path  # KFP's full output
    wall_s: float
    plots: list[str]  # the comparison plots (PNG files; also in the compare run's MLflow artifacts)


def absolute(cfg: PipelineConfig, root: Path = REPO) -> PipelineConfig:
    """``cfg`` with every local path (and a relative sqlite tracking URI) made absolute under ``root``."""
    def path(p: str) -> str:
        return str(p if Path(p).is_absolute() else (root / p).resolve())

    uri = cfg.train.tracking.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + path(uri[len("sqlite:///"):])
    train = replace(cfg.train, tracking=replace(cfg.train.tracking, tracking_uri=uri),
                    task=replace(cfg.train.task, data_dir=path(cfg.train.task.data_dir)))
    data = replace(cfg.data, data_dir=path(cfg.data.data_dir), dvc_file=path(cfg.data.dvc_file))
    return replace(cfg, workspace=path(cfg.workspace), data=data, train=train)


class _Tee:
    """Send this process's stdout/stderr (file descriptors 1 and 2, which the KFP runner and its
    subprocesses write to) to a log file; echo the task-level lines to the console."""

    def __init__(self, log: Path, echo: bool = True) -> None:
        self.log, self.echo = log, echo

    def __enter__(self) -> _Tee:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        self.console = os.fdopen(os.dup(self.saved[0]), "w", buffering=1)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self.reader = os.fdopen(read_fd, "r", errors="replace")
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()
        # Python-level streams too (a test runner may have replaced sys.stdout with its own object).
        self.streams = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self.writer = os.fdopen(os.dup(1), "w", buffering=1)
        return self

    def _pump(self) -> None:
        with self.log.open("a") as out:
            for line in self.reader:
                out.write(line)
                out.flush()
                if self.echo and _SHOW.search(line):
                    self.console.write(_ANSI.sub("", line.strip()) + "\n")

    def __exit__(self, *exc: Any) -> None:
        sys.stdout, sys.stderr = self.streams
        self.writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        self.thread.join(timeout=10)
        for fd in self.saved:
            os.close(fd)
        self.console.close()


def run_local(cfg: PipelineConfig, echo: bool = True) -> LocalRun:
    """Run the pipeline on this machine (module docstring); raises when a step fails."""
    from kfp import local

    from pipelines.dag import build_pipeline
    from trace_core.tracking import ensure_experiment

    cfg = absolute(cfg)
    workspace = Path(cfg.workspace)
    (workspace / "logs").mkdir(parents=True, exist_ok=True)
    log = workspace / "logs" / time.strftime("%Y%m%d-%H%M%S.log")
    tracking = cfg.train.tracking
    # Artifacts of the local runs next to the database (MLflow's default would be ./mlruns).
    db = Path(tracking.tracking_uri[len("sqlite:///"):]) if tracking.tracking_uri.startswith("sqlite:///") else None
    experiment_id = ensure_experiment(tracking.tracking_uri, tracking.experiment,
                                      str(db.parent / "mlartifacts") if db else None)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workspace / "kfp"),
               raise_on_error=True)
    pipeline = build_pipeline(cfg, platform=False, parallelism=1)  # one method at a time on a small machine
    t0 = time.perf_counter()
    print_fn = builtins.print  # kfp.local swaps print for an indenting one per task; not thread-safe
    try:
        with _Tee(log, echo=echo):
            task = pipeline()
    except Exception as err:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-80:])
        raise RuntimeError(f"the local pipeline failed: {err}\n--- last lines of {log} ---\n{tail}") from err
    finally:
        builtins.print = print_fn
    out = json.loads(task.output)
    return LocalRun(out["table"], out["training_runs"], out["compare_run"], tracking.tracking_uri,
                    tracking.experiment, experiment_id, log, time.perf_counter() - t0, out.get("plots", []))


def ui_command(tracking_uri: str, port: int = 5000) -> str:
    """The command that serves the MLflow UI on ``tracking_uri``."""
    mlflow = Path(sys.executable).with_name("mlflow")
    return f"{mlflow} ui --backend-store-uri {tracking_uri} --port {port}"


def latest_comparison(tracking_uri: str, experiment: str) -> tuple[str, list[str]] | None:
    """(experiment id, training run ids in the table's order) of the newest comparison logged to
    ``experiment`` on ``tracking_uri``; None when there is none yet."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string="tags.`pipeline.step` = 'compare'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None
    tags = runs[0].data.tags
    methods = [m for m in tags.get("compare.methods", "").split(",") if m]
    return found.experiment_id, [tags[f"compare.run.{m}"] for m in methods if f"compare.run.{m}" in tags]


def compare_url(experiment_id: str, run_ids: list[str], base: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's compare view of ``run_ids``."""
    runs = json.dumps(run_ids, separators=(",", ":"))
    return f"{base}/#/compare-runs?runs={runs}&experiments={json.dumps([experiment_id], separators=(',', ':'))}"
