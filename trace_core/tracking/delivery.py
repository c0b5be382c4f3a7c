"""Delivering a spool later: a run whose store was down sends its records once the store is back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from trace_core.tracking.mlflow_tracker import MLflowTracker
from trace_core.tracking.protocol import END_STATUSES, TrackingConfig
from trace_core.tracking.spool import Spool


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
