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

from trace_core.errors import TrackingStoreError
from trace_core.tracking.delivery import (
    DeliveryReport,
    deliver,
)
from trace_core.tracking.mlflow_tracker import (
    STORE_ERROR_LOGGERS,
    MLflowTracker,
    UnsendableRecord,
    store_logs_quiet,
)
from trace_core.tracking.protocol import (
    BATCH_METRICS,
    BATCH_PARAMS,
    END_STATUSES,
    FAILURE_TAG,
    INVALID,
    MAX_KEY,
    MAX_PARAM_VALUE,
    REJECTED_TAG,
    RUNNING,
    STORE_SCHEMES,
    NullTracker,
    RunKilled,
    Tracker,
    TrackingConfig,
    error_in_one_line,
    mlflow_name,
    warn,
)
from trace_core.tracking.spool import (
    Spool,
    SpoolMeta,
)
from trace_core.tracking.status import (
    end_after,
    tracked_run,
)
from trace_core.tracking.store import (
    ensure_experiment,
    sqlite_path,
    store_client,
    store_lock,
)

__all__ = [
    "BATCH_METRICS",
    "BATCH_PARAMS",
    "DeliveryReport",
    "END_STATUSES",
    "FAILURE_TAG",
    "INVALID",
    "MAX_KEY",
    "MAX_PARAM_VALUE",
    "MLflowTracker",
    "NullTracker",
    "REJECTED_TAG",
    "RUNNING",
    "RunKilled",
    "STORE_ERROR_LOGGERS",
    "STORE_SCHEMES",
    "Spool",
    "SpoolMeta",
    "Tracker",
    "TrackingConfig",
    "TrackingStoreError",
    "UnsendableRecord",
    "deliver",
    "end_after",
    "ensure_experiment",
    "error_in_one_line",
    "mlflow_name",
    "sqlite_path",
    "store_client",
    "store_lock",
    "store_logs_quiet",
    "tracked_run",
    "warn",
]
