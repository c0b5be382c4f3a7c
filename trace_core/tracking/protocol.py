"""The tracking contract: the :class:`Tracker` protocol every tracker implements, the run's tracking
settings, the no-op tracker, and the names MLflow accepts."""

from __future__ import annotations

import re
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


def error_in_one_line(err: BaseException) -> str:
    """An error in one line: MLflow's messages can carry a whole SQL statement."""
    # SQLAlchemy puts its "(raised as a result of Query-invoked autoflush; ...)" note before the cause.
    text = [line for line in str(err).strip().splitlines() if not line.startswith("(raised as a result of")]
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def warn(message: str) -> None:
    print(f"trace-rl tracking: {message}", file=sys.stderr, flush=True)
