"""The MLflow tracker: records go to the spool, then to the store in batches; an outage is reported
once when it starts and once when it ends, and the run goes on."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trace_core.errors import TrackingStoreError
from trace_core.locks import LOCK_NAME, HeldLock, LockHeld, hold, lead_process
from trace_core.tracking.protocol import (
    BATCH_METRICS,
    BATCH_PARAMS,
    END_STATUSES,
    INVALID,
    MAX_PARAM_VALUE,
    REJECTED_TAG,
    RUNNING,
    TrackingConfig,
    error_in_one_line,
    mlflow_name,
    warn,
)
from trace_core.tracking.spool import Spool, SpoolMeta
from trace_core.tracking.store import ensure_experiment, store_client


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
                                     f"{error_in_one_line(err)}") from err
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
                                     f"{error_in_one_line(err)}") from err

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
                self._down_at_start(error_in_one_line(err))
                return
            raise TrackingStoreError(f"tracking.tracking_uri {uri} must be a store this run can write to: "
                                     f"{error_in_one_line(err)}") from err
        self.flush()

    def _down_at_start(self, reason: str) -> None:
        warn(f"tracking server {self.config.tracking_uri} is down ({reason}): training goes on, and its "
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
            warn(f"{self.rejected} values of run {self.run_id} were refused by {self.config.tracking_uri} as "
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
                warn(f"the spool {self.spool} cannot be written ({error_in_one_line(err)}): the run's tags and status "
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
        warn(f"{self.pending} records (the final status {status} among them) are still in the spool "
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
            return self._stalled(error_in_one_line(err))
        one_by_one = False
        while self._pending:
            batch = self._next_batch(one_by_one)
            try:
                self._send(client, batch)
            except Exception as err:  # noqa: BLE001 — sorted out below
                if not _is_invalid(err):
                    return self._stalled(error_in_one_line(err))
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
            warn(f"{self.config.tracking_uri} takes records again after {time.monotonic() - since:.0f} s: "
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
                    return self._stalled(error_in_one_line(err))
                refused[key] = error_in_one_line(err)
        if refused:
            try:
                self._probe(client)
            except Exception as err:  # noqa: BLE001
                return self._stalled(f"{error_in_one_line(err)} (and it refused {len(refused)} values as invalid)")
            self._spool.reject(rec, refused)
            self.rejected += len(refused)
            first = next(iter(refused.items()))
            warn(f"{self.config.tracking_uri} refused {len(refused)} {rec['kind']} values of run {self.run_id} as "
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
            warn(f"cannot deliver to {self.config.tracking_uri} ({reason}): {self.pending} records wait in "
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


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_VALUE]
