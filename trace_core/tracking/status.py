"""A run's status in the store: FINISHED, FAILED with its reason, or KILLED on SIGTERM or SIGINT
(:func:`tracked_run`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from trace_core.failures import RunFailed
from trace_core.tracking.protocol import FAILURE_TAG, RunKilled, Tracker, error_in_one_line, warn


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
            tracker.set_tags({FAILURE_TAG: str(err) if isinstance(err, RunFailed) else error_in_one_line(err)})
        except Exception as tag_err:  # noqa: BLE001 — the error that ended the run matters more
            warn(f"could not record why the run failed: {error_in_one_line(tag_err)}")
    _end(tracker, status)


def _end(tracker: Tracker, status: str) -> None:
    try:
        tracker.close(status)
    except Exception as err:  # noqa: BLE001 — the error that ended the run matters more
        warn(f"could not end the run {status}: {error_in_one_line(err)}")


def _pass_on(killed: RunKilled, handler: Any) -> None:
    if callable(handler):  # e.g. Python's own SIGINT handler, which raises KeyboardInterrupt
        handler(killed.signum, None)
    raise SystemExit(128 + killed.signum)  # the default action ends the process: so do we
