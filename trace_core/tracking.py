"""Experiment tracking: the one module through which trace-rl reaches MLflow.

Everything logs through the narrow :class:`Tracker` protocol (verl's tracking facade, in spirit).
:class:`MLflowTracker` writes every record to an append-only *spool* on local disk first and then
sends it; a record leaves the spool only once the store has confirmed it. So:

* a store that cannot take the run's records is an error when the tracker is built, before any
  work (:meth:`MLflowTracker.preflight`, naming the URI and the reason); only an HTTP server that is
  down then is waited for, with a warning;
* a store that fails later (server down, database locked, unwritable or full, local or not) never
  stops training and loses nothing: records wait in the spool and are sent when it is back
  (retried at most every ``retry_interval_s``). An outage is two lines on stderr, one when it
  starts (the reason) and one when it ends (how long, how many records were spooled meanwhile and
  delivered): MLflow's own traceback of each failed request is dropped (:func:`store_logs_quiet`);
* a value the store refuses as invalid (MLflow's ``INVALID_PARAMETER_VALUE``, e.g. a param
  re-logged with another value) is that value's fault, and no retry mends it: it alone is set
  aside in ``rejected.jsonl``, counted (:attr:`MLflowTracker.rejected`, the run tag
  ``tracking.rejected_values``) and reported on stderr, and the records after it go on;
* the run's status travels in the spool with its records: :func:`tracked_run` ends a run FAILED on
  an exception (with the reason as the tag ``tracking.failure``) and KILLED on SIGTERM/SIGINT, and
  reopens a resumed run as RUNNING. A spool that cannot be written (a full disk) fails the record
  being logged, except the run's tags and status, which then go to the store from memory, so
  that a run stopped by its own full spool still ends FAILED with the reason;
* one process writes a spool at a time: a second tracker on it in another process is refused at
  once, naming the holder's pid (:mod:`trace_core.locks`); a new sqlite store is created by one
  process at a time (:func:`store_lock`);
* records still spooled when a run closes are counted on stderr, with the command that delivers
  them and the final status later (``trace-rl deliver <spool_dir>``, :func:`deliver`); a new
  tracker on the same spool (a resumed run) delivers them too;
* a killed process loses nothing it logged, and resending is idempotent: a metric keeps the
  timestamp it was logged with, and MLflow drops an exact duplicate (key, step, timestamp, value),
  so a crash between "sent" and "acknowledged" never duplicates a step.

Metric and param names are made valid for MLflow (:func:`mlflow_name`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trace_core.failures import RunFailed
from trace_core.locks import LOCK_NAME, HeldLock, LockHeld, hold, lead_process
from trace_core.locks import exclusive as exclusive_lock

_NAME_OK = re.compile(r"[^A-Za-z0-9_\-. :/]")
MAX_PARAM_VALUE = 6000
MAX_KEY = 250
BATCH_METRICS = 1000  # MLflow's log_batch limits
BATCH_PARAMS = 100
RUNNING = "RUNNING"
END_STATUSES = ("FINISHED", "FAILED", "KILLED")
INVALID = "INVALID_PARAMETER_VALUE"  # MLflow's error code for a request it refuses as invalid
REJECTED_TAG = "tracking.rejected_values"
FAILURE_TAG = "tracking.failure"  # why a run ended FAILED (a RunFailed's message; other exceptions in one line)
# The tracking stores MLflow itself knows ("": a local folder); SQLAlchemy URIs may name a driver
# (postgresql+psycopg2://).
STORE_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def mlflow_name(name: str) -> str:
    """Map any string to a valid MLflow metric/param key (letters, digits, ``_-. :/``)."""
    out = _NAME_OK.sub("_", str(name)).strip().lstrip("/")
    if not out or out in (".", ".."):
        raise ValueError(f"{name!r} cannot be turned into an MLflow key")
    return out[:MAX_KEY]


class TrackingStoreError(RuntimeError):
    """The tracking store (or the spool) cannot take this run's records."""


class RunKilled(BaseException):
    """SIGTERM or SIGINT inside :func:`tracked_run`. A BaseException, like KeyboardInterrupt, so that
    an ``except Exception`` in training code does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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

    def mark_running(self) -> None:
        """The run is (again) RUNNING: a resumed run reopens."""
        ...

    def close(self, status: str = "FINISHED") -> int:
        """End the run with ``status``; returns how many records are not delivered yet. Closing again
        with the same status changes nothing."""
        ...


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

    def mark_running(self) -> None:
        pass

    def close(self, status: str = "FINISHED") -> int:
        return 0


@dataclass
class TrackingConfig:
    """Where and how runs are tracked."""

    tracking_uri: str = "sqlite:///runs/mlflow.db"  # MLflow tracking URI: http://host:port or sqlite:///path
    experiment: str = "trace-rl"  # MLflow experiment name
    run_name: str | None = None  # display name of the run
    spool_dir: str = "runs/spool"  # local spool for records not yet acknowledged by the server
    retry_interval_s: float = 10.0  # how often to retry a store that failed
    request_timeout_s: float = 10.0  # HTTP timeout per MLflow request
    request_max_retries: int = 1  # MLflow's own HTTP retries per request (it backs off between them)

    def __post_init__(self) -> None:
        scheme = urllib.parse.urlparse(self.tracking_uri).scheme.split("+")[0]
        if not self.tracking_uri.strip() or scheme not in STORE_SCHEMES:
            raise ValueError(f"tracking_uri {self.tracking_uri!r} is not an MLflow store: its scheme must be one of "
                             f"{', '.join(s + '://' for s in STORE_SCHEMES if s)} or a local path")
        if not self.experiment.strip():
            raise ValueError("experiment must be a non-empty name")
        if not self.retry_interval_s >= 0:
            raise ValueError(f"retry_interval_s must be >= 0, got {self.retry_interval_s}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.request_max_retries < 0:
            raise ValueError(f"request_max_retries must be >= 0, got {self.request_max_retries}")


# ==================================================================== the spool on disk
@dataclass
class SpoolMeta:
    """What delivering a spool needs without the process that wrote it (``run.json``)."""

    run_id: str | None = None  # None: the run is not created on the store yet
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # the run's tags at creation


class Spool:
    """One run's records on local disk: ``journal.jsonl`` (every record, append-only),
    ``acked.txt`` (the seqs the store confirmed, or whose refused values were set aside),
    ``rejected.jsonl`` (those values, with the store's reason), ``run.json`` (:class:`SpoolMeta`)
    and ``files/`` (copies of the artifacts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = root / "journal.jsonl"
        self.acked = root / "acked.txt"
        self.rejected = root / "rejected.jsonl"
        self.meta_file = root / "run.json"
        self.files = root / "files"

    def exists(self) -> bool:
        return self.journal.is_file() or self.meta_file.is_file()

    def create(self) -> None:
        self.files.mkdir(parents=True, exist_ok=True)
        for path in (self.journal, self.acked):
            _end_torn_line(path)

    def read_meta(self) -> SpoolMeta:
        if not self.meta_file.is_file():
            return SpoolMeta()
        data = json.loads(self.meta_file.read_text())
        return SpoolMeta(**{k: data[k] for k in SpoolMeta.__dataclass_fields__ if k in data})

    def write_meta(self, meta: SpoolMeta) -> None:
        tmp = self.meta_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(meta)))
        tmp.replace(self.meta_file)

    def unacked(self) -> tuple[list[dict[str, Any]], int]:
        """The records the store has not confirmed, in order, and the next free seq."""
        acked = set(self.acked.read_text().split()) if self.acked.exists() else set()
        pending, seq = [], 0
        for rec in self.records():
            seq = max(seq, rec["seq"] + 1)
            if str(rec["seq"]) not in acked:
                pending.append(rec)
        return pending, seq

    def last_status(self) -> str | None:
        """The last run status spooled (None: none was)."""
        statuses = [r["status"] for r in self.records() if r["kind"] in ("status", "end")]
        return statuses[-1] if statuses else None

    def append(self, rec: dict[str, Any]) -> None:
        _append_lines(self.journal, [json.dumps(rec, allow_nan=True)])

    def ack(self, records: list[dict[str, Any]]) -> None:
        _append_lines(self.acked, [str(r["seq"]) for r in records])

    def reject(self, rec: dict[str, Any], reasons: dict[str | None, str]) -> None:
        _append_lines(self.rejected, [json.dumps({"seq": rec["seq"], "kind": rec["kind"], "key": key, "reason": why})
                                      for key, why in reasons.items()])

    def rejected_count(self) -> int:
        return len(self.rejected.read_text().splitlines()) if self.rejected.exists() else 0

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record in the journal, in order."""
        if not self.journal.exists():
            return
        for line in self.journal.read_text().splitlines():
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a torn line from a kill: it was never acknowledged
                continue


def _append_lines(path: Path, lines: list[str]) -> None:
    try:
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename is not None:
            raise
        # A failed write names no file (a full disk at flush): the error says which file it was.
        raise OSError(err.errno, err.strerror, str(path)) from err


def _end_torn_line(path: Path) -> None:
    # A process killed mid-write leaves a last line without its newline; the next line appended
    # would be glued to it and lost with it.
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


# ==================================================================== the tracker
class MLflowTracker:
    """A Tracker backed by MLflow, with a durable spool (see the module docstring).

    ``preflight=False`` skips the start-up check (:meth:`preflight`): for tools that only deliver."""

    def __init__(self, config: TrackingConfig, run_id: str | None = None, tags: Mapping[str, Any] | None = None,
                 *, preflight: bool = True):
        self.config = config
        self.spool = Path(config.spool_dir)
        self._spool = Spool(self.spool)
        try:
            self._spool.create()
            meta = self._spool.read_meta()
        except OSError as err:
            raise TrackingStoreError(f"tracking.spool_dir {self.spool} must be a folder this run can write to: "
                                     f"{_reason(err)}") from err
        self._lock: HeldLock | None = None
        self._hold_spool()  # one writer per spool: a second process is refused here, naming the holder
        if run_id is not None and meta.run_id not in (None, run_id):
            raise ValueError(f"spool {self.spool} belongs to run {meta.run_id}, not {run_id}; "
                             "use a fresh spool_dir for a new run")
        self.run_id = run_id or meta.run_id
        self._tags = {mlflow_name(k): str(v) for k, v in (tags or meta.tags).items()}
        self._pending, self._seq = self._spool.unacked()
        # A run that exists already, or a spool written before, may hold an ended run: reopening it
        # (mark_running) sets it RUNNING again; a fresh run is RUNNING from its creation.
        self._reopened = self.run_id is not None or self._seq > 0
        self._status: str | None = None  # the end status this tracker spooled last (None: open)
        self._client: Any = None
        self._next_retry = 0.0
        self._failing: str | None = None  # why delivery stopped last (None: it did not)
        # since when delivery fails: (monotonic time, the next seq then, records delivered then)
        self._outage: tuple[float, int, int] | None = None
        self._unspooled: list[dict[str, Any]] = []  # tags and statuses the spool could not take, not yet sent
        self.delivered = 0  # records the store confirmed through this tracker
        self.rejected = self._spool.rejected_count()  # values the store refused as invalid, in all
        self._rejected_tagged = self.rejected
        # MLflow retries failed requests with exponential back-off (minutes by default); a
        # training step must not wait that long for an unreachable server.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(config.request_max_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(config.request_timeout_s)))
        self._save_meta()
        if preflight:
            self.preflight()

    @property
    def pending(self) -> int:
        """Records logged but not yet confirmed by the store (still in the spool)."""
        return len(self._pending)

    def _hold_spool(self) -> None:
        """Hold the spool's writer lock (:mod:`trace_core.locks`) while this tracker writes it: from
        its creation to :meth:`close`, and again when it writes after that (a reopened run)."""
        if (self._lock is not None and self._lock.held) or not lead_process():
            return
        try:
            self._lock = hold(self.spool / LOCK_NAME, f"tracking.spool_dir {self.spool}")
        except LockHeld as err:
            raise TrackingStoreError(str(err)) from None
        except OSError as err:
            raise TrackingStoreError(f"tracking.spool_dir {self.spool} must be a folder this run can write to: "
                                     f"{_reason(err)}") from err

    def _release_spool(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # ---------------------------------------------------------------- start-up check
    def preflight(self) -> None:
        with store_logs_quiet():
            self._preflight()

    def _preflight(self) -> None:
        """Prove that the store takes this run's records, before any work: create the run (or find
        the resumed one), make a write that changes nothing, check that a local artifact location
        can be written, then deliver what an earlier process left in the spool. Raises
        :class:`TrackingStoreError` naming the URI and the reason, except for an HTTP server that is
        down: it may come back, so training goes on with a warning and the records wait."""
        uri = self.config.tracking_uri
        if self._is_http() and not self.server_reachable():
            self._down_at_start("it does not answer")
            return
        try:
            self._probe(self._connect())
        except Exception as err:  # noqa: BLE001 — every cause is reported with the URI
            if self._is_http() and not self.server_reachable():  # it went down meanwhile
                self._down_at_start(_reason(err))
                return
            raise TrackingStoreError(f"tracking.tracking_uri {uri} must be a store this run can write to: "
                                     f"{_reason(err)}") from err
        self.flush()

    def _down_at_start(self, reason: str) -> None:
        _warn(f"tracking server {self.config.tracking_uri} is down ({reason}): training goes on, and its "
              f"records wait in the spool {self.spool} until the server is back (retried every "
              f"{self.config.retry_interval_s:g} s)")
        self._failing = reason
        self._outage = (time.monotonic(), self._seq - len(self._pending), self.delivered)
        self._next_retry = time.monotonic() + self.config.retry_interval_s

    def _probe(self, client: Any) -> None:
        run = client.get_run(self.run_id)
        if run.info.lifecycle_stage != "active":  # MLflow refuses every value logged to a deleted run
            raise ValueError(f"run {self.run_id} is {run.info.lifecycle_stage}")
        client.update_run(self.run_id)  # a write that changes nothing: a read-only store fails here
        _check_local_artifacts(run.info.artifact_uri)

    def _connect(self) -> Any:
        """The MLflow client, with the run created if it is not yet."""
        if self._client is None:
            self._client = store_client(self.config.tracking_uri)
        if self.run_id is None:
            exp_id = ensure_experiment(self.config.tracking_uri, self.config.experiment, client=self._client)
            run = self._client.create_run(exp_id, run_name=self.config.run_name, tags=self._tags)
            self.run_id = run.info.run_id
            self._save_meta()
        return self._client

    def _save_meta(self) -> None:
        self._spool.write_meta(SpoolMeta(run_id=self.run_id, tracking_uri=self.config.tracking_uri,
                                         experiment=self.config.experiment, run_name=self.config.run_name,
                                         tags=self._tags))

    # ---------------------------------------------------------------- logging API
    def log_params(self, params: Mapping[str, Any]) -> None:
        clean = {mlflow_name(k): _param_value(v) for k, v in params.items()}
        self._log("params", params=clean)

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
        self._log("metrics", metrics=clean, step=int(step), timestamp=ts)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._log("tags", tags={mlflow_name(k): str(v)[:MAX_PARAM_VALUE] for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if not path.exists():
            raise ValueError(f"artifact {path} does not exist")
        # A folder per record keeps the artifact's own name in MLflow.
        copy = self._spool.files / f"{self._seq:08d}" / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        self._log("artifact", local=str(copy), artifact_path=artifact_path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        name = Path(artifact_file).name
        tmp = self._spool.files / f"{self._seq:08d}_dict"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(json.dumps(data, indent=1, default=str))
        parent = str(Path(artifact_file).parent)
        self._log("artifact", local=str(tmp / name), artifact_path=None if parent == "." else parent)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        name = Path(artifact_file).name
        tmp = self._spool.files / f"{self._seq:08d}_fig"
        tmp.mkdir(parents=True, exist_ok=True)
        figure.savefig(tmp / name, dpi=110, bbox_inches="tight")
        parent = str(Path(artifact_file).parent)
        self._log("artifact", local=str(tmp / name), artifact_path=None if parent == "." else parent)

    def mark_running(self) -> None:
        """Reopen the run as RUNNING if it may have ended (a resume, or after :meth:`close`); a
        fresh run is RUNNING already."""
        if self._reopened or self._status is not None:
            self._status = None
            self._append("status", status=RUNNING)
            self.flush()

    def close(self, status: str = "FINISHED") -> int:
        """End the run with ``status`` (FINISHED, FAILED or KILLED): spooled after every record and
        delivered with them. Returns how many records are still spooled (0: the store has them all);
        if any, stderr says how many, and how to deliver them. Closing again with the same status
        changes nothing."""
        if status not in END_STATUSES:
            raise ValueError(f"close(status={status!r}): a run ends {', '.join(END_STATUSES)}")
        if status == self._status:
            return self.pending
        # The spool on disk is the truth: a signal between a record's write and its entry in memory
        # must not leave that record out of the count below.
        self._hold_spool()
        self._pending, self._seq = self._spool.unacked()
        self._pending += self._unspooled
        self.flush()  # first, so that the rejection count below includes every record before the end
        self._tag_rejections()
        self._append("status", status=status)
        self._status = status
        self.flush()
        if self._pending:
            self._report_undelivered(status)
        if self.rejected:
            _warn(f"{self.rejected} values of run {self.run_id} were refused by {self.config.tracking_uri} as "
                  f"invalid; they are listed in {self._spool.rejected}")
        self._release_spool()  # ended: `trace-rl deliver` (another process) may take the spool now
        return self.pending

    def _log(self, kind: str, **payload: Any) -> None:
        self._append(kind, **payload)
        if time.monotonic() >= self._next_retry:
            self.flush()

    def _append(self, kind: str, **payload: Any) -> None:
        self._hold_spool()
        rec = {"seq": self._seq, "kind": kind, **payload}
        self._seq += 1
        try:
            self._spool.append(rec)
        except OSError as err:
            if kind not in ("tags", "status"):
                raise
            # How the run ends (and why) must reach the store even when the spool's disk is full:
            # sent from memory, and sending a tag or a status again is harmless.
            if not self._unspooled:
                _warn(f"the spool {self.spool} cannot be written ({_reason(err)}): the run's tags and status "
                      "go to the store without it")
            self._unspooled.append(rec)
        self._pending.append(rec)

    def _tag_rejections(self) -> None:
        # The count goes on the run itself, so that whoever reads the run sees values are missing.
        if self.rejected > self._rejected_tagged:
            self._append("tags", tags={REJECTED_TAG: str(self.rejected)})
            self._rejected_tagged = self.rejected

    def _report_undelivered(self, status: str) -> None:
        uri = self.config.tracking_uri
        shown = (f"the store still shows run {self.run_id} as RUNNING, not {status}" if self.run_id
                 else f"the run is not created on {uri} yet")
        _warn(f"{self.pending} records (the final status {status} among them) are still in the spool "
              f"{self.spool}, not delivered to {uri} ({self._failing}); {shown}. Deliver them once the "
              f"store is back with\n    trace-rl deliver {self.spool}\n"
              "(the next run on this spool delivers them too).")

    # ---------------------------------------------------------------- delivery
    def _is_http(self) -> bool:
        return self.config.tracking_uri.startswith(("http://", "https://"))

    def server_reachable(self) -> bool:
        """For an HTTP server, whether it answers its health check; other stores are tried directly."""
        if not self._is_http():
            return True
        try:
            with urllib.request.urlopen(self.config.tracking_uri.rstrip("/") + "/health",
                                        timeout=self.config.request_timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def flush(self) -> bool:
        """Send the pending records in order; True when none is left. A store failure keeps them all
        (tried again on a later call); a value the store refuses as invalid is set aside
        (:meth:`_send_values`) and the records after it go on."""
        with store_logs_quiet():
            return self._flush()

    def _flush(self) -> bool:
        if not self._pending:
            return True
        if not self.server_reachable():
            return self._stalled("the server does not answer")
        try:
            client = self._connect()
        except Exception as err:  # noqa: BLE001 — the store is at fault: the records wait
            return self._stalled(_reason(err))
        one_by_one = False
        while self._pending:
            batch = self._next_batch(one_by_one)
            try:
                self._send(client, batch)
            except Exception as err:  # noqa: BLE001 — sorted out below
                if not _is_invalid(err):
                    return self._stalled(_reason(err))
                if len(batch) > 1:  # which record is at fault: send them one at a time
                    one_by_one = True
                    continue
                if not self._send_values(client, batch[0]):
                    return False
                continue
            self._confirm(batch)
            one_by_one = False
        if self._failing is not None:
            since, seq, delivered = self._outage or (time.monotonic(), self._seq, self.delivered)
            _warn(f"{self.config.tracking_uri} takes records again after {time.monotonic() - since:.0f} s: "
                  f"{self._seq - seq} records were spooled meanwhile, and {self.delivered - delivered} waiting "
                  f"records are delivered from the spool {self.spool}")
            self._failing, self._outage = None, None
        return True

    def _send_values(self, client: Any, rec: dict[str, Any]) -> bool:
        """A record the store refused as invalid: send its values one at a time and set aside those
        it refuses. The values are at fault only if the store then takes a write that changes
        nothing (:meth:`_probe`); otherwise the store is, and the record waits (False)."""
        refused: dict[str | None, str] = {}
        for key in _keys(rec):
            try:
                self._send(client, [rec], only=key)
            except Exception as err:  # noqa: BLE001
                if not _is_invalid(err):
                    return self._stalled(_reason(err))
                refused[key] = _reason(err)
        if refused:
            try:
                self._probe(client)
            except Exception as err:  # noqa: BLE001
                return self._stalled(f"{_reason(err)} (and it refused {len(refused)} values as invalid)")
            self._spool.reject(rec, refused)
            self.rejected += len(refused)
            first = next(iter(refused.items()))
            _warn(f"{self.config.tracking_uri} refused {len(refused)} {rec['kind']} values of run {self.run_id} as "
                  f"invalid (first: {first[0]!r}: {first[1]}); set aside in {self._spool.rejected}")
        self._confirm([rec])
        return True

    def _confirm(self, batch: list[dict[str, Any]]) -> None:
        with contextlib.suppress(OSError):  # a full disk: the store has them, and takes a resend as a duplicate
            self._spool.ack(batch)
        sent = {id(r) for r in batch}
        self._unspooled = [r for r in self._unspooled if id(r) not in sent]
        del self._pending[: len(batch)]
        self.delivered += len(batch)

    def _stalled(self, reason: str) -> bool:
        self._next_retry = time.monotonic() + self.config.retry_interval_s
        if self._failing is None:  # once per outage, not at every retry
            self._outage = (time.monotonic(), self._seq - len(self._pending), self.delivered)
            _warn(f"cannot deliver to {self.config.tracking_uri} ({reason}): {self.pending} records wait in "
                  f"the spool {self.spool} (retried every {self.config.retry_interval_s:g} s)")
        self._failing = reason
        return False

    def _next_batch(self, one_by_one: bool) -> list[dict[str, Any]]:
        """The head record; with the metric records right after it, up to BATCH_METRICS values."""
        head = self._pending[0]
        if head["kind"] != "metrics" or one_by_one:
            return [head]
        batch, values = [], 0
        for rec in self._pending:
            if rec["kind"] != "metrics" or (batch and values + len(rec["metrics"]) > BATCH_METRICS):
                break
            batch.append(rec)
            values += len(rec["metrics"])
        return batch

    def _send(self, client: Any, batch: list[dict[str, Any]], only: str | None = None) -> None:
        """Send ``batch`` (records of one kind); ``only``: just that key of a single record."""
        from mlflow.entities import Metric, Param, RunTag

        rec, kind = batch[0], batch[0]["kind"]
        if kind == "metrics":
            metrics = [Metric(k, float(v), r["timestamp"], r["step"])
                       for r in batch for k, v in r["metrics"].items() if only in (None, k)]
            for i in range(0, len(metrics), BATCH_METRICS):
                client.log_batch(self.run_id, metrics=metrics[i : i + BATCH_METRICS])
        elif kind in ("params", "tags"):
            make = Param if kind == "params" else RunTag
            items = [make(k, v) for k, v in rec[kind].items() if only in (None, k)]
            for i in range(0, len(items), BATCH_PARAMS):
                client.log_batch(self.run_id, **{kind: items[i : i + BATCH_PARAMS]})
        elif kind == "artifact":
            local = Path(rec["local"])
            if not local.exists():
                raise UnsendableRecord(f"its spooled copy {local} is missing")
            if local.is_dir():
                client.log_artifacts(self.run_id, str(local), rec.get("artifact_path"))
            else:
                client.log_artifact(self.run_id, str(local), rec.get("artifact_path"))
        elif kind in ("status", "end"):  # "end": spools written before RUNNING was a status
            if rec["status"] == RUNNING:
                client.update_run(self.run_id, status=RUNNING)
            else:
                client.set_terminated(self.run_id, status=rec["status"])
        else:
            raise UnsendableRecord(f"spool record of unknown kind {kind!r}")


class UnsendableRecord(ValueError):
    """A spooled record that no store can take (its artifact copy is gone, its kind unknown): it is
    set aside like a value the store refuses."""

    error_code = INVALID


def _keys(rec: dict[str, Any]) -> list[str | None]:
    """A record's values that can be sent one at a time ([None]: the record is one value)."""
    values = rec.get(rec["kind"]) if rec["kind"] in ("metrics", "params", "tags") else None
    return list(values) if values else [None]


def _is_invalid(err: BaseException) -> bool:
    return getattr(err, "error_code", None) == INVALID


def _reason(err: BaseException) -> str:
    """An error in one line: MLflow's messages can carry a whole SQL statement."""
    # SQLAlchemy puts its "(raised as a result of Query-invoked autoflush; ...)" note before the cause.
    text = [line for line in str(err).strip().splitlines() if not line.startswith("(raised as a result of")]
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def _check_local_artifacts(artifact_uri: str) -> None:
    """A local artifact location must be creatable; nothing is created here (MLflow does it on the
    first artifact)."""
    parsed = urllib.parse.urlparse(artifact_uri)
    if parsed.scheme not in ("", "file"):
        return
    path = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else artifact_uri)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise NotADirectoryError(f"artifact location {path} cannot be created: {probe} is not a writable folder")


# MLflow's loggers that print a whole traceback for a request the store fails (its database layer
# logs each SQLAlchemy error before raising it), or a line per HTTP retry.
STORE_ERROR_LOGGERS = ("mlflow.store.db.utils", "urllib3.connectionpool")


class _DropStoreErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


_DROP_STORE_ERRORS = _DropStoreErrors()
_quiet_depth = 0


@contextlib.contextmanager
def store_logs_quiet() -> Iterator[None]:
    """While the tracker talks to the store, MLflow's own warnings and error tracebacks about a
    failing request are dropped (:data:`STORE_ERROR_LOGGERS`): the tracker reports each outage
    itself, once when it starts and once when it ends, and the error it raises says why."""
    global _quiet_depth
    if _quiet_depth == 0:
        for name in STORE_ERROR_LOGGERS:
            logging.getLogger(name).addFilter(_DROP_STORE_ERRORS)
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1
        if _quiet_depth == 0:
            for name in STORE_ERROR_LOGGERS:
                logging.getLogger(name).removeFilter(_DROP_STORE_ERRORS)


def _warn(message: str) -> None:
    print(f"trace-rl tracking: {message}", file=sys.stderr, flush=True)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_VALUE]


# ==================================================================== run status
@contextlib.contextmanager
def tracked_run(tracker: Tracker) -> Iterator[Tracker]:
    """A tracked run's life around a block: RUNNING while it runs (a resumed run reopens), then
    FINISHED when the block returns, FAILED on an exception, KILLED on SIGTERM or SIGINT.

    The exception goes on; after a signal, what the handler before ours would have done happens
    (SIGINT: KeyboardInterrupt; SIGTERM: exit with status 128 + 15, through the ``finally`` blocks
    on the way). Handlers are installed only in the main thread (Python runs them only there), not
    over a signal that is ignored on purpose, and the previous ones are put back on exit."""
    previous = _catch_signals()
    try:
        tracker.mark_running()
        yield tracker
    except BaseException as err:
        _restore_signals(previous)
        end_after(tracker, err)
        if isinstance(err, RunKilled):
            _pass_on(err, previous[err.signum])
        raise
    finally:
        _restore_signals(previous)
    tracker.close("FINISHED")


def _status_after(err: BaseException) -> str:
    if isinstance(err, RunKilled | KeyboardInterrupt):
        return "KILLED"
    if isinstance(err, SystemExit) and err.code in (0, None):
        return "FINISHED"
    return "FAILED"


def _catch_signals() -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        old = signal.getsignal(sig)
        if old is signal.SIG_IGN or old is None:  # ignored on purpose, or owned by C code: leave it
            continue
        previous[sig] = old
        signal.signal(sig, _raise_killed)
    return previous


def _raise_killed(signum: int, frame: Any) -> None:
    raise RunKilled(signum)


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def end_after(tracker: Tracker, err: BaseException) -> None:
    """End the run as ``err`` ends it: KILLED after a signal, FAILED otherwise, with the reason
    (the error in one line) as the run's tag ``tracking.failure``. :func:`tracked_run` ends its
    block so; call it for an error after the run exists but outside the block (an engine that
    cannot be built)."""
    status = _status_after(err)
    if status == "FAILED":
        try:  # a run-time failure's plain message, as its entry point prints it; otherwise the error's line
            tracker.set_tags({FAILURE_TAG: str(err) if isinstance(err, RunFailed) else _reason(err)})
        except Exception as tag_err:  # noqa: BLE001 — the error that ended the run matters more
            _warn(f"could not record why the run failed: {_reason(tag_err)}")
    _end(tracker, status)


def _end(tracker: Tracker, status: str) -> None:
    try:
        tracker.close(status)
    except Exception as err:  # noqa: BLE001 — the error that ended the run matters more
        _warn(f"could not end the run {status}: {_reason(err)}")


def _pass_on(killed: RunKilled, handler: Any) -> None:
    if callable(handler):  # e.g. Python's own SIGINT handler, which raises KeyboardInterrupt
        handler(killed.signum, None)
    raise SystemExit(128 + killed.signum)  # the default action ends the process: so do we


# ==================================================================== delivering a spool later
@dataclass
class DeliveryReport:
    """What :func:`deliver` did."""

    spool_dir: str
    tracking_uri: str
    run_id: str | None  # None: the run could not be created yet
    delivered: int  # records the store confirmed in this delivery
    pending: int  # records still in the spool (0: all delivered)
    rejected: int  # values the store refused as invalid, in all (listed in rejected.jsonl)
    status: str | None  # the last run status spooled (None: none; RUNNING: the writer never closed the run)
    error: str | None  # why records are still in the spool


def deliver(spool_dir: str | Path, tracking_uri: str | None = None, status: str | None = None,
            wait_s: float = 0.0, retry_interval_s: float = 2.0) -> DeliveryReport:
    """Deliver a run's spool to its tracking store (``tracking_uri`` instead, when given): create the
    run if it never was, send every record in order, set the spooled final status (``status``
    instead, when given). An unreachable store is retried for ``wait_s`` seconds."""
    spool = Spool(Path(spool_dir))
    if not spool.exists():
        raise ValueError(f"spool_dir {spool_dir} is not a tracking spool: it has no journal.jsonl or run.json")
    meta = spool.read_meta()
    uri = tracking_uri or meta.tracking_uri
    if not uri:
        raise ValueError(f"spool {spool_dir} does not name its tracking store: pass its tracking URI")
    if status is not None and status not in END_STATUSES:
        raise ValueError(f"status {status!r}: a run ends {', '.join(END_STATUSES)}")
    cfg = TrackingConfig(tracking_uri=uri, experiment=meta.experiment or TrackingConfig.experiment,
                         run_name=meta.run_name, spool_dir=str(spool_dir), retry_interval_s=retry_interval_s)
    tracker = MLflowTracker(cfg, tags=meta.tags, preflight=False)
    if status is not None:
        tracker._append("status", status=status)
    deadline = time.monotonic() + wait_s
    while not tracker.flush() and time.monotonic() < deadline:
        time.sleep(min(retry_interval_s, max(0.0, deadline - time.monotonic())))
    tracker._tag_rejections()
    tracker.flush()
    return DeliveryReport(spool_dir=str(spool_dir), tracking_uri=uri, run_id=tracker.run_id,
                          delivered=tracker.delivered, pending=tracker.pending, rejected=tracker.rejected,
                          status=spool.last_status(), error=tracker._failing)


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None,
                      client: Any = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location`` when given) if missing.
    Two processes creating it at once both get its id: on a sqlite store they take turns
    (:func:`store_lock`); elsewhere the one that loses the race reads the winner's."""
    client = client or store_client(tracking_uri)
    with store_lock(tracking_uri):
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except Exception:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None: another store, or in memory)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """On a sqlite store, the exclusive lock of the file beside the database (``<db>.lock``) for a
    block; nothing elsewhere. MLflow creates and migrates a new sqlite store on first use, and two
    processes doing that at once fail (one finds the other's half-made tables)."""
    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(db.with_name(db.name + ".lock")):
        yield


_STORES_READY: set[str] = set()  # sqlite stores this process has opened (created and migrated)


def store_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` on ``tracking_uri``. A sqlite store's first use (which creates it, or
    migrates an old one) is made under :func:`store_lock`, so that concurrent runs take turns."""
    from mlflow.tracking import MlflowClient

    if sqlite_path(tracking_uri) is None or tracking_uri in _STORES_READY:
        return MlflowClient(tracking_uri=tracking_uri)
    with store_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)  # MLflow opens the store here: tables, migrations
        client.search_experiments(max_results=1)
    _STORES_READY.add(tracking_uri)
    return client
