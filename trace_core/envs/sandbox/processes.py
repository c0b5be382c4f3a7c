"""The sandbox's processes seen from the host: the init's status records, and stopping a sandbox so
that nothing of its PID namespace is left when the call returns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time


def _init_records(raw: bytes) -> list[dict]:
    """The init's status records. Only the init (root) can write its channel; parsed defensively all
    the same, so that a garbled line can never raise in the host."""
    records = []
    for line in raw.decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


def _terminate(proc: subprocess.Popen, grace_seconds: float = 5.0) -> None:
    """Kills a sandbox and returns only once every process in its PID namespace is gone.

    Killing the init (PID 1 of the namespace) makes the kernel kill and reap everything else in the
    namespace before the init itself can be reaped; unshare, its parent, exits only after reaping it.
    So waiting for unshare after killing the init proves nothing of the call is left. Killing
    unshare instead would also work (--kill-child), but returns before the namespace is torn down.
    """
    inits, unshare_killed = [], False
    if proc.poll() is None:
        inits = _children(proc.pid)
        for child in inits:
            try:
                os.kill(child, signal.SIGKILL)  # a child of our unshare, not yet reaped: no pid reuse
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()  # --kill-child: the init gets SIGKILL when unshare dies, and is torn down
            unshare_killed = True
    proc.wait()
    # Killed, unshare returns before the namespace is gone (on a loaded host its teardown can take
    # seconds): wait for the init itself, as the guarantee above says. Only then: an init unshare
    # reaped is gone, and its pid may already be another process's.
    for pid in inits if unshare_killed else ():
        _wait_gone(pid, grace_seconds * 6)


def _wait_gone(pid: int, timeout_seconds: float) -> None:
    """Returns once `pid` has exited (gone or a zombie), or after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)


def _signal_name(sig: int) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
    meaning = {
        "SIGSEGV": "segmentation fault",
        "SIGABRT": "abort",
        "SIGBUS": "bus error",
        "SIGFPE": "arithmetic fault",
        "SIGILL": "illegal instruction",
        "SIGKILL": "kill",
        "SIGTERM": "termination request",
    }.get(name)
    return f"{name} ({meaning})" if meaning else name
