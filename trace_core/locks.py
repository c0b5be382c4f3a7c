"""Advisory file locks (``fcntl.flock``) that say who holds them: one writer per run folder.

    lock = hold(Path(out) / LOCK_NAME, "output_dir runs/train/trace")  # refused at once when held
    ...                                                                # the run writes its folder
    lock.release()                                                     # (or the process ends)

A lock is held by a process, not by an object: a process that holds it may take it again (each
``hold`` counts, each ``release`` uncounts), so a trainer that resumes in the same process (a
test, a benchmark) is not refused by its own earlier attempt, while any other process is, at
once, with the holder's pid in the error. The kernel drops the lock when the holder dies, even
by SIGKILL: a crashed run never leaves a stale lock behind. In a distributed job the ranks are one
writer: only the process whose ``RANK`` is 0 (or unset) takes the locks.

:func:`exclusive` is the blocking form, for a short critical section between processes (creating a
new sqlite tracking store, whose first migration two processes must not run at once).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".writer.lock"  # the lock file of a folder that one process writes


class LockHeld(RuntimeError):
    """Another process holds the lock: ``pid`` is its process id (None when it has not written it)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


class HeldLock:
    """A lock this process holds; :meth:`release` it once per :func:`hold`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd, self.count = path, fd, 1

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        with _GUARD:
            if self._fd is None:
                return
            self.count -= 1
            if self.count > 0:
                return
            _HELD.pop(str(self.path), None)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_GUARD = threading.Lock()
_HELD: dict[str, HeldLock] = {}  # real path of the lock file -> the lock this process holds there


def lead_process() -> bool:
    """Whether this process takes the locks: not a rank > 0 of a distributed job."""
    try:
        return int(os.environ.get("RANK", "0") or 0) == 0
    except ValueError:
        return True


def holder(path: str | Path) -> int | None:
    """The pid written in the lock file at ``path`` (None: none, or not readable)."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def hold(path: str | Path, what: str) -> HeldLock:
    """Take the exclusive lock on ``path`` (created if missing) without waiting; raises
    :class:`LockHeld` naming ``what`` and the holder's pid when another process has it."""
    path = Path(os.path.realpath(path))
    with _GUARD:
        held = _HELD.get(str(path))
        if held is not None and held.held:
            held.count += 1
            return held
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = holder(path)
            who = f"process {pid}" if pid is not None else "another process"
            raise LockHeld(f"{what} is in use: {who} holds its lock {path} (one writer at a time); wait for it "
                           "to end, or write elsewhere", pid) from None
        except BaseException:
            os.close(fd)
            raise
        mine = f"{os.getpid()}\n".encode()
        os.pwrite(fd, mine, 0)
        os.ftruncate(fd, len(mine))
        lock = HeldLock(path, fd)
        _HELD[str(path)] = lock
        return lock


@contextlib.contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold the exclusive lock on ``path`` (created if missing) for a block, waiting for it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock
