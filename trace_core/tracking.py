"""Experiment tracking: the one module through which trace-rl reaches MLflow.

Everything logs through the narrow :class:`Tracker` protocol (verl's tracking facade, in spirit).
:class:`MLflowTracker` writes every record to an append-only *spool* on local disk first and then
sends it; records the server has not acknowledged stay in the spool. So:

* an unreachable tracking server never stops training — records wait in the spool and are sent
  when the server is back (checked at most every ``retry_interval_s``);
* a killed process loses nothing it logged: a new tracker on the same spool (the trainer passes
  the same ``spool_dir`` and ``run_id`` when it resumes) resends what was not acknowledged;
* resending is idempotent: a metric keeps the timestamp it was logged with, and MLflow drops an
  exact duplicate (key, step, timestamp, value), so a crash between "sent" and "acknowledged"
  never duplicates a step.

Metric and param names are made valid for MLflow (:func:`mlflow_name`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

_NAME_OK = re.compile(r"[^A-Za-z0-9_\-. :/]")
MAX_PARAM_VALUE = 6000
MAX_KEY = 250
BATCH_METRICS = 1000  # MLflow's log_batch limits
BATCH_PARAMS = 100


def mlflow_name(name: str) -> str:
    """Map any string to a valid MLflow metric/param key (letters, digits, ``_-. :/``)."""
    out = _NAME_OK.sub("_", str(name)).strip().lstrip("/")
    if not out or out in (".", ".."):
        raise ValueError(f"{name!r} cannot be turned into an MLflow key")
    return out[:MAX_KEY]


class Tracker(Protocol):
    """What the trainer, evaluator and components log through."""

    run_id: str | None

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def log_dict(self, data: Any, artifact_file: str) -> None: ...

    def log_figure(self, figure: Any, artifact_file: str) -> None: ...

    def flush(self) -> bool: ...

    def close(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Logs nothing (library use without a tracking server)."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_dict(self, data: Any, artifact_file: str) -> None:
        pass

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        pass

    def flush(self) -> bool:
        return True

    def close(self, status: str = "FINISHED") -> None:
        pass


@dataclass
class TrackingConfig:
    """Where and how runs are tracked."""

    tracking_uri: str = "sqlite:///runs/mlflow.db"  # MLflow tracking URI: http://host:port or sqlite:///path
    experiment: str = "trace-rl"  # MLflow experiment name
    run_name: str | None = None  # display name of the run
    spool_dir: str = "runs/spool"  # local spool for records not yet acknowledged by the server
    retry_interval_s: float = 10.0  # how often to retry an unreachable server
    request_timeout_s: float = 10.0  # HTTP timeout per MLflow request
    request_max_retries: int = 1  # MLflow's own HTTP retries per request (it backs off between them)


class MLflowTracker:
    """A Tracker backed by MLflow, with a durable spool (see the module docstring)."""

    def __init__(self, config: TrackingConfig, run_id: str | None = None, tags: Mapping[str, Any] | None = None):
        self.config = config
        self.run_id = run_id
        self._tags = {mlflow_name(k): str(v) for k, v in (tags or {}).items()}
        self.spool = Path(config.spool_dir)
        self.spool.mkdir(parents=True, exist_ok=True)
        (self.spool / "files").mkdir(exist_ok=True)
        self._journal = self.spool / "journal.jsonl"
        self._acked = self.spool / "acked.txt"
        self._state_file = self.spool / "run.json"
        self._next_retry = 0.0
        self._seq = 0
        self._pending: list[dict[str, Any]] = []
        # MLflow retries failed requests with exponential back-off (minutes by default); a
        # training step must not wait that long for an unreachable server.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(config.request_max_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(config.request_timeout_s)))
        self._load_spool()
        self._client = None
        if self.run_id is None and self.server_reachable():
            try:  # create the run now so its id can go into the first checkpoint
                self._client_or_create()
            except Exception as err:  # noqa: BLE001 — it will be created on a later flush
                warnings.warn(f"could not create the MLflow run yet: {err}", stacklevel=2)
        self.flush()

    # ---------------------------------------------------------------- spool
    def _load_spool(self) -> None:
        if self._state_file.exists():
            state = json.loads(self._state_file.read_text())
            if self.run_id is not None and state.get("run_id") not in (None, self.run_id):
                raise ValueError(
                    f"spool {self.spool} belongs to run {state['run_id']}, not {self.run_id}; "
                    "use a fresh spool_dir for a new run"
                )
            self.run_id = self.run_id or state.get("run_id")
        acked = set(self._acked.read_text().split()) if self._acked.exists() else set()
        if self._journal.exists():
            for line in self._journal.read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a torn last line from a kill: it was never acknowledged
                    continue
                self._seq = max(self._seq, rec["seq"] + 1)
                if str(rec["seq"]) not in acked:
                    self._pending.append(rec)

    def _save_state(self) -> None:
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": self.run_id}))
        tmp.replace(self._state_file)

    def _append(self, kind: str, **payload: Any) -> None:
        rec = {"seq": self._seq, "kind": kind, **payload}
        self._seq += 1
        with self._journal.open("a") as f:
            f.write(json.dumps(rec, allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._pending.append(rec)

    def _ack(self, records: list[dict[str, Any]]) -> None:
        with self._acked.open("a") as f:
            f.write("".join(f"{r['seq']}\n" for r in records))
            f.flush()
            os.fsync(f.fileno())

    @property
    def pending(self) -> int:
        """Records logged but not yet acknowledged by the server."""
        return len(self._pending)

    # ---------------------------------------------------------------- logging API
    def log_params(self, params: Mapping[str, Any]) -> None:
        clean = {mlflow_name(k): _param_value(v) for k, v in params.items()}
        self._append("params", params=clean)
        self._maybe_flush()

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        """``timestamp`` (ms): pass the original one when re-logging a step, so MLflow drops the
        exact duplicate instead of storing the step twice."""
        ts = int(time.time() * 1000) if timestamp is None else int(timestamp)
        clean = {}
        for k, v in metrics.items():
            if v is None:
                continue
            value = float(v)
            clean[mlflow_name(k)] = value if math.isfinite(value) else repr(value)
        self._append("metrics", metrics=clean, step=int(step), timestamp=ts)
        self._maybe_flush()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._append("tags", tags={mlflow_name(k): str(v)[:MAX_PARAM_VALUE] for k, v in tags.items()})
        self._maybe_flush()

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if not path.exists():
            raise ValueError(f"artifact {path} does not exist")
        # A folder per record keeps the artifact's own name in MLflow.
        copy = self.spool / "files" / f"{self._seq:08d}" / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        self._append("artifact", local=str(copy), artifact_path=artifact_path)
        self._maybe_flush()

    def log_dict(self, data: Any, artifact_file: str) -> None:
        name = Path(artifact_file).name
        tmp = self.spool / "files" / f"{self._seq:08d}_dict"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(json.dumps(data, indent=1, default=str))
        parent = str(Path(artifact_file).parent)
        self._append("artifact", local=str(tmp / name), artifact_path=None if parent == "." else parent)
        self._maybe_flush()

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        name = Path(artifact_file).name
        tmp = self.spool / "files" / f"{self._seq:08d}_fig"
        tmp.mkdir(parents=True, exist_ok=True)
        figure.savefig(tmp / name, dpi=110, bbox_inches="tight")
        parent = str(Path(artifact_file).parent)
        self._append("artifact", local=str(tmp / name), artifact_path=None if parent == "." else parent)
        self._maybe_flush()

    def close(self, status: str = "FINISHED") -> None:
        self._append("end", status=status)
        self.flush()

    # ---------------------------------------------------------------- sending
    def _maybe_flush(self) -> None:
        if time.monotonic() >= self._next_retry:
            self.flush()

    def server_reachable(self) -> bool:
        uri = self.config.tracking_uri
        if not uri.startswith(("http://", "https://")):
            return True  # a local store is always reachable
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=self.config.request_timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def flush(self) -> bool:
        """Send every pending record; returns True when nothing is left pending."""
        if not self._pending:
            return True
        if not self.server_reachable():
            self._next_retry = time.monotonic() + self.config.retry_interval_s
            return False
        while self._pending:
            try:
                self._send_pending()
            except Exception as err:  # noqa: BLE001 — sorted out below
                if not self.server_reachable():  # the server went away: keep everything for later
                    self._next_retry = time.monotonic() + self.config.retry_interval_s
                    return False
                # The server is up and refused this record (e.g. a param re-logged with another
                # value): it will never be accepted, so drop it loudly instead of blocking the rest.
                bad = self._pending.pop(0)
                self._ack([bad])
                warnings.warn(f"MLflow rejected a {bad['kind']} record (seq {bad['seq']}): {err}", stacklevel=2)
        return True

    def _client_or_create(self):
        from mlflow.tracking import MlflowClient

        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.config.tracking_uri)
        if self.run_id is None:
            exp = self._client.get_experiment_by_name(self.config.experiment)
            exp_id = exp.experiment_id if exp else self._client.create_experiment(self.config.experiment)
            run = self._client.create_run(exp_id, run_name=self.config.run_name, tags=self._tags)
            self.run_id = run.info.run_id
            self._save_state()
        return self._client

    def _send_pending(self) -> None:
        from mlflow.entities import Metric, Param, RunTag

        client = self._client_or_create()
        while self._pending:
            rec = self._pending[0]
            kind = rec["kind"]
            if kind == "metrics":
                # Consecutive metric records go in batches of up to BATCH_METRICS values.
                batch, metrics = [], []
                for r in self._pending:
                    if r["kind"] != "metrics" or len(metrics) + len(r["metrics"]) > BATCH_METRICS:
                        break
                    batch.append(r)
                    metrics += [Metric(k, float(v), r["timestamp"], r["step"]) for k, v in r["metrics"].items()]
                if not batch:  # a single record larger than a batch
                    batch = [rec]
                    metrics = [Metric(k, float(v), rec["timestamp"], rec["step"]) for k, v in rec["metrics"].items()]
                for i in range(0, len(metrics), BATCH_METRICS):
                    client.log_batch(self.run_id, metrics=metrics[i : i + BATCH_METRICS])
                done = batch
            elif kind == "params":
                items = [Param(k, v) for k, v in rec["params"].items()]
                for i in range(0, len(items), BATCH_PARAMS):
                    client.log_batch(self.run_id, params=items[i : i + BATCH_PARAMS])
                done = [rec]
            elif kind == "tags":
                items = [RunTag(k, v) for k, v in rec["tags"].items()]
                for i in range(0, len(items), BATCH_PARAMS):
                    client.log_batch(self.run_id, tags=items[i : i + BATCH_PARAMS])
                done = [rec]
            elif kind == "artifact":
                local = Path(rec["local"])
                if local.is_dir():
                    client.log_artifacts(self.run_id, str(local), rec.get("artifact_path"))
                elif local.exists():
                    client.log_artifact(self.run_id, str(local), rec.get("artifact_path"))
                done = [rec]
            elif kind == "end":
                client.set_terminated(self.run_id, status=rec["status"])
                done = [rec]
            else:
                raise ValueError(f"spool record of unknown kind {kind!r}")
            self._ack(done)
            del self._pending[: len(done)]


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_VALUE]


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location`` when given) if missing."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location)
