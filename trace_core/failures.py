"""How a run that stops says why: refused before any work, or failed once work has started.

A *refusal* is a bad input found before anything ran (:func:`refused_before_work`): one line,
exit status 2, no tracking run left behind. A *run-time failure* is everything after that: a full
disk under a checkpoint, a dead rollout engine, a spool that cannot be written. Whatever layer
raised it, it becomes one :class:`RunFailed`, whose message says, in plain words:

* what failed: the step and phase the run was in, and the path or component it was writing;
* the cause: an errno in words ("no space left on device") with its file, wherever in the chain
  of exceptions it was raised; a write that failed without an errno (torch's zip writer) on a
  file system with no room left is named for what it is;
* what was kept: the last complete checkpoint (or that none was written yet);
* the command that resumes;
* where the traceback is: appended to ``failure.log`` in the run's folder (entry points print it
  on stderr only when asked, e.g. ``trace-rl train --debug``).

The same message becomes the tracking run's failure tag, so the console and MLflow say one thing.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import os
import shutil
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FAILURE_LOG = "failure.log"  # in the run's folder: the traceback of each run-time failure, appended
NEARLY_FULL_BYTES = 1 << 20  # a file system with less room than this is taken as full after a failed write


def refused_before_work() -> tuple[type[BaseException], ...]:
    """The errors a run raises before any work (nothing trained, no tracking run left RUNNING),
    each a bad input the message names: a configuration value or path
    (:class:`~trace_core.config.ConfigError`), invalid data
    (:class:`~trace_core.data.reading.DataValidationError`), a tracking store that cannot take the
    run, an output_dir another process writes or whose checkpoint is another configuration's
    (:class:`~trace_core.errors.RunRefused`). Entry points report them in one line
    with exit status 2."""
    from trace_core.config import ConfigError
    from trace_core.data.reading import DataValidationError
    from trace_core.errors import RunRefused, TrackingStoreError

    return ConfigError, DataValidationError, TrackingStoreError, RunRefused


@dataclass(frozen=True)
class RunFailure:
    """A run-time failure in words (:meth:`message` joins them)."""

    during: str  # what the run was doing: its step and phase ("train trace step 3/4: checkpoint")
    cause: str  # what went wrong, in words, with the path or component when known
    kept: str | None  # the last complete checkpoint (None: none was written yet)
    resume: str | None  # the command that resumes the run (None: rerun the same command)
    log_file: str | None  # where the traceback is (None: it could not be written)
    log_error: str | None = None  # why the traceback could not be written

    def message(self) -> str:
        kept = f"the last complete checkpoint, {self.kept}" if self.kept else "no checkpoint yet (a rerun starts over)"
        resume = self.resume or "rerun the same command"
        trace = (f"{self.log_file} (or rerun with --debug)" if self.log_file
                 else f"not written ({self.log_error}); rerun with --debug to see it")
        return (f"the run failed during {self.during}\n"
                f"  cause: {self.cause}\n"
                f"  kept: {kept}\n"
                f"  resume: {resume} (once the cause is fixed; it goes on from the last complete checkpoint)\n"
                f"  traceback: {trace}")


class RunFailed(RuntimeError):
    """A run-time failure, raised from the original error; its text is the plain message."""

    def __init__(self, failure: RunFailure) -> None:
        super().__init__(failure.message())
        self.failure = failure


class _Doing:
    """What a block was doing when an error left it (:func:`doing`)."""

    def __init__(self, what: str, path: Path | None) -> None:
        self.what, self.path = what, path


@contextlib.contextmanager
def doing(what: str, path: str | Path | None = None) -> Iterator[None]:
    """Name what the block does (``"writing checkpoint step_000003"``) and the path it writes, on
    any error that leaves it: the failure message says so, and checks that path's file system for
    room when the error itself carries no errno. The innermost block's name wins."""
    try:
        yield
    except Exception as err:
        if getattr(err, "_trace_doing", None) is None:
            with contextlib.suppress(AttributeError, TypeError):  # an exception type without a __dict__
                err._trace_doing = _Doing(what, None if path is None else Path(path))
        raise


def run_failed(err: BaseException, *, during: str, kept: str | Path | None, output_dir: str | Path | None,
               resume: str | None) -> RunFailed:
    """The :class:`RunFailed` for ``err``: its traceback appended to ``output_dir``'s
    :data:`FAILURE_LOG` (named in the message), its cause in words (:func:`cause_in_words`).
    Raise it ``from err``."""
    if isinstance(err, RunFailed):
        return err
    log_file, log_error = None, None
    if output_dir is not None:
        log = Path(output_dir) / FAILURE_LOG
        try:
            with log.open("a") as f:
                f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} the run failed during {during}\n")
                f.write("".join(traceback.format_exception(err)))
            log_file = str(log)
        except OSError as log_err:  # the run folder's disk may be the one that is full
            log_error = f"{log}: {cause_in_words(log_err)}"
    else:
        log_error = "the run has no folder"
    return RunFailed(RunFailure(during=during, cause=cause_in_words(err), kept=None if kept is None else str(kept),
                                resume=resume, log_file=log_file, log_error=log_error))


def cause_in_words(err: BaseException) -> str:
    """The cause of ``err`` in one line: what the innermost :func:`doing` block was doing and where,
    then an OS error anywhere in the chain in words with its file (``spooling the step's records
    (runs/t/spool): no space left on device (runs/t/spool/journal.jsonl)``); without one, a full
    file system under that block's path; otherwise the error's type and first line."""
    chain = list(_chain(err))
    what = next((d for e in chain if (d := getattr(e, "_trace_doing", None)) is not None), None)
    prefix = f"{what.what}{f' ({what.path})' if what.path else ''}: " if what else ""
    os_err = next((e for e in chain if isinstance(e, OSError) and e.errno), None)
    if os_err is not None:
        files = " -> ".join(str(f) for f in (os_err.filename, os_err.filename2)
                            if f and not (what and what.path and Path(f) == what.path))
        if not prefix and os_err is not err and _ours(err):  # our own words say which component
            prefix = f"{first_line(err)}: "
        return f"{prefix}{errno_in_words(os_err.errno)}{f' ({files})' if files else ''}"
    if what is not None and what.path is not None and (room := _room_left(what.path)) is not None \
            and room < NEARLY_FULL_BYTES:
        return f"{prefix}{errno_in_words(errno_codes.ENOSPC)} ({room} bytes free on its file system)"
    return f"{prefix}{first_line(err)}"


def errno_in_words(code: int) -> str:
    """An errno as words: ``28`` -> ``no space left on device``."""
    text = os.strerror(code)
    return text[:1].lower() + text[1:]


def first_line(err: BaseException) -> str:
    """An error's first line (at most 300 characters), after its type unless it is one of ours
    (whose messages are written as words)."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    return lines[0][:300] if _ours(err) else f"{type(err).__name__}: {lines[0][:300]}"


def _ours(err: BaseException) -> bool:
    return type(err).__module__.startswith("trace_core.")


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, then its causes and contexts, depth first, each once."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _room_left(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None
