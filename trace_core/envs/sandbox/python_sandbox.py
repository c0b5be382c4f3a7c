"""`PythonSandbox`, one sandbox call from the host's side: the preflight and the self-test, the
init's spec, feeding the job and reading every channel until EOF under the wall clock and the
output cap, and the `SandboxResult` made of what the host saw. How a call is confined is told in
`confinement`, how its time is accounted in `reports`.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from trace_core.envs.sandbox.config import SandboxConfig, SandboxResult, SandboxUnavailableError
from trace_core.envs.sandbox.confinement import (
    _ETC_COPIES,
    _RUNNER_INSIDE,
    _UNSHARE_FLAGS,
    _WORKDIR,
    _base_env,
    _interpreter_view,
    _UidLease,
)
from trace_core.envs.sandbox.processes import _init_records, _signal_name, _terminate
from trace_core.envs.sandbox.reports import (
    _RUNNER_CHANNEL_CAP,
    _cell_walls,
    _finite_seconds,
    _read_reports,
    _ReportChannel,
)

# The two scripts that run inside the namespaces sit next to this module (stdlib only, run by path).
_HERE = Path(__file__).resolve().parent
_INIT = _HERE / "_sandbox_init.py"
_RUNNER = _HERE / "_sandbox_runner.py"

_READ_CHUNK = 65536
_INIT_DEADLINE_GRACE_S = 2.0  # the init's own alarm, a backstop should the host die mid-call

_VERIFIED: set[tuple] = set()
_VERIFY_LOCK = threading.Lock()

_SELF_TEST = """
import os, socket
ok = {first} <= os.getuid() < {first} + {count} and os.getgid() == {gid} and os.getgroups() == []
nets = sorted(name for _, name in socket.if_nameindex())
try:
    open('/sandbox-write-probe', 'w')
    root_writable = True
except OSError:
    root_writable = False
print({{'uid_ok': ok, 'nets': nets, 'root_writable': root_writable, 'pid': os.getpid() < 10,
        'env': sorted(os.environ), 'host_visible': os.path.exists({probe!r}), 'tmp': sorted(os.listdir('/tmp'))}})
"""


class PythonSandbox:
    """Runs Python cells in a fresh, isolated process tree; one instance can serve many threads.

    `run(code)` executes one cell; `run(code, history=cells)` first replays `cells` silently in the
    same process (see `PythonToolSession`). Raises `SandboxUnavailableError` if the sandbox cannot
    be built here; otherwise every outcome of the code, hostile or not, is a `SandboxResult`.
    """

    def __init__(self, config: SandboxConfig | None = None, verify: bool = True) -> None:
        self.config = config or SandboxConfig()
        self._unshare = self._preflight()
        # Our own interpreter's site-packages are known here, so the runner can skip `site`; another
        # interpreter finds its own through `site` at start-up.
        self._view = _interpreter_view(self.config.python)
        self._site_dirs = self._view.site_dirs
        if verify:
            self._self_test()

    def _preflight(self) -> str:
        if os.name != "posix" or not sys.platform.startswith("linux"):
            raise SandboxUnavailableError("the Python sandbox needs Linux namespaces; refusing to run code")
        if os.geteuid() != 0:
            raise SandboxUnavailableError(
                "the Python sandbox must start as root (or with CAP_SYS_ADMIN) to create namespaces and "
                f"drop to uid {self.config.uid}; running as uid {os.geteuid()}, "
                "refusing to run model code unconfined"
            )
        unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
        if unshare is None:
            raise SandboxUnavailableError(
                "`unshare` (util-linux) not found; refusing to run model code unconfined"
            )
        if not os.access(self.config.python, os.X_OK):
            raise SandboxUnavailableError(f"sandbox interpreter {self.config.python} is not executable")
        return unshare

    def _self_test(self) -> None:
        c = self.config
        key = (c.python, c.uid, c.uid_count, c.gid)
        with _VERIFY_LOCK:
            if key in _VERIFIED:
                return
            result = self.run(_SELF_TEST.format(first=c.uid, count=c.uid_count, gid=c.gid, probe=str(_INIT)))
            # the private dir, and the way down to an exposed folder under the host's /tmp (a venv there)
            tmp = sorted({"w", *(d.split("/")[2] for d in self._view.expose if d.startswith("/tmp/"))})
            expected = (
                "{'uid_ok': True, 'nets': ['lo'], 'root_writable': False, 'pid': True, 'env': "
                f"{sorted(_base_env(c))}, 'host_visible': False, 'tmp': {tmp}}}"
            )
            if not result.completed or result.stdout.strip() != expected:
                raise SandboxUnavailableError(
                    "sandbox self-test failed, refusing to run model code; expected\n"
                    f"  {expected}\ngot\n  {result.observation}"
                )
            _VERIFIED.add(key)

    def _spec(self, uid: int, init_fd: int, runner_fd: int, cpu_hard: int, deadline_seconds: float) -> dict:
        c = self.config
        return {
            "uid": uid,
            "gid": c.gid,
            "python": self._view.python,
            "runner": str(_RUNNER),
            "runner_inside": _RUNNER_INSIDE,
            "workdir": _WORKDIR,
            "tmp_size_bytes": c.tmp_bytes,
            "shm_size_bytes": c.shm_bytes,
            "max_files": c.max_files,
            "expose": list(self._view.expose),
            "links": self._view.links,
            "etc_copies": list(_ETC_COPIES),
            "passwd": (
                f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{c.gid}::{_WORKDIR}:/bin/sh\n"
            ),
            "group": f"root:x:0:\nsandbox:x:{c.gid}:\n",
            "rlimits": {
                "RLIMIT_CPU": [cpu_hard, cpu_hard + 1],
                "RLIMIT_AS": c.memory_bytes,
                "RLIMIT_FSIZE": c.max_file_bytes,
                "RLIMIT_NPROC": c.max_processes,
                "RLIMIT_NOFILE": c.max_open_files,
                "RLIMIT_CORE": 0,
                "RLIMIT_MSGQUEUE": 0,  # POSIX message queues: kernel memory no other limit counts
            },
            "env": _base_env(c),
            "site_dirs": self._site_dirs,
            "init_fd": init_fd,
            "runner_fd": runner_fd,
            "deadline_seconds": deadline_seconds + _INIT_DEADLINE_GRACE_S,
        }

    def run(
        self,
        code: str,
        history: Sequence[str] = (),
        replay_seconds: float = 0.0,
        replay_cpu_seconds: float = 0.0,
    ) -> SandboxResult:
        """Runs `code` (after silently replaying `history`) and returns what the host observed.

        replay_seconds / replay_cpu_seconds: extra wall-clock / CPU time granted for the replay.
        """
        if not isinstance(code, str):
            raise ValueError(f"code must be a str, got {type(code).__name__}")
        for name, value in (("replay_seconds", replay_seconds), ("replay_cpu_seconds", replay_cpu_seconds)):
            if _finite_seconds(value) is None:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        c = self.config
        cells = [*history, code]
        job = json.dumps(
            {
                "cells": cells,
                "seed": c.seed,
                "cell_cpu_seconds": c.cpu_seconds,
                "echo_last_expression": c.echo_last_expression,
                "site_dirs": self._site_dirs,
            }
        ).encode()
        cpu_hard = c.cpu_seconds + math.ceil(replay_cpu_seconds) + 1  # + start-up; the runner lowers it
        lease = _UidLease(c.uid, c.uid_count)
        try:
            return self._run_as(lease.uid, job, len(cells), cpu_hard, replay_seconds)
        finally:
            lease.release()  # only after the call's whole PID namespace is gone (see `_terminate`)

    def _run_as(self, uid: int, job: bytes, n_cells: int, cpu_hard: int, replay_seconds: float) -> SandboxResult:
        c = self.config
        init_r, init_w = os.pipe()
        runner_r, runner_w = os.pipe()
        start = time.monotonic()
        try:
            spec = self._spec(uid, init_w, runner_w, cpu_hard, c.startup_seconds + c.wall_seconds + replay_seconds)
            argv = [self._unshare, *_UNSHARE_FLAGS, c.python, "-I", "-S", str(_INIT), json.dumps(spec)]
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                cwd="/",
                pass_fds=(init_w, runner_w),
                start_new_session=True,
            )
        finally:
            os.close(init_w)
            os.close(runner_w)
        try:
            outcome = self._collect(proc, job, init_r, runner_r, start, replay_seconds, n_cells)
        finally:
            if proc.poll() is None:
                _terminate(proc)
            os.close(init_r)
            os.close(runner_r)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        return self._result(outcome, n_cells, time.monotonic() - start, proc.returncode, cpu_hard)

    def _collect(
        self,
        proc: subprocess.Popen,
        job: bytes,
        init_r: int,
        runner_r: int,
        start: float,
        replay_seconds: float,
        n_cells: int,
    ) -> dict:
        """Feeds the job, reads all channels until EOF, kills on wall clock or output cap.

        The job is written through the same loop, so a large job can never block the host past
        the deadline. Until the runner's ready line is read the deadline is start-up's own; from
        then the call has `wall_seconds` plus the replay's grant. Once the host has read as many
        report lines as there are replayed cells, the visible cell has `wall_seconds` from then on:
        what the replay did not use of its grant is not lent to it, and a report written early by
        the code only brings its deadline closer.
        """
        cap = self.config.max_output_bytes
        streams = {"stdout": bytearray(), "stderr": bytearray(), "init": bytearray()}
        reports = _ReportChannel(start)
        out = {"timed_out": False, "truncated": False, "stopped": None, "streams": streams, "reports": reports}
        deadline = start + self.config.startup_seconds
        visible_clock_started = False
        pending = memoryview(job)
        sel = selectors.DefaultSelector()
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        sel.register(init_r, selectors.EVENT_READ, "init")
        sel.register(runner_r, selectors.EVENT_READ, "runner")
        visible = 0
        try:
            while sel.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    out["timed_out"] = True
                    out["stopped"] = time.monotonic() - start
                    _terminate(proc)
                    break
                for key, _ in sel.select(timeout=min(remaining, 0.5)):
                    if key.data == "stdin":
                        try:
                            pending = pending[os.write(key.fd, pending) :]
                        except BrokenPipeError:
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(key.fd)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    name = key.data
                    if name == "runner":
                        now = time.monotonic()
                        was_ready = reports.ready is not None
                        reports.feed(chunk, now)
                        if reports.ready is None:
                            continue
                        if not was_ready:  # start-up is over: the call's clock starts
                            deadline = start + reports.ready + self.config.wall_seconds + replay_seconds
                        # with no replay the call's deadline is the cell's
                        if n_cells > 1 and not visible_clock_started and len(reports.lines) >= n_cells - 1:
                            visible_clock_started = True
                            replay_done = reports.start + reports.lines[n_cells - 2][0]
                            deadline = min(deadline, replay_done + self.config.wall_seconds)
                        continue
                    buf = streams[name]
                    if name in ("stdout", "stderr"):
                        visible += len(chunk)
                        buf += chunk[: max(0, cap - (visible - len(chunk)))]
                        if visible > cap and not out["truncated"]:
                            out["truncated"] = True
                            out["stopped"] = time.monotonic() - start
                            _terminate(proc)
                    elif len(buf) < _RUNNER_CHANNEL_CAP:
                        buf += chunk
        finally:
            sel.close()
        return out

    def _result(
        self, out: dict, n_cells: int, wall: float, returncode: int | None, cpu_hard: int
    ) -> SandboxResult:
        c = self.config
        streams = out["streams"]
        init = _init_records(streams["init"])
        errors = [r for r in init if r.get("kind") == "error"]
        if errors:
            raise SandboxUnavailableError(
                f"sandbox setup failed ({errors[-1].get('stage')}): {errors[-1].get('message')}; "
                "no code was run"
            )
        exits = [r for r in init if r.get("kind") == "exit"]
        killed_by_host = out["timed_out"] or out["truncated"]
        if not exits and not killed_by_host:
            raise SandboxUnavailableError(
                f"sandbox did not start (unshare exit status {returncode}): "
                f"{streams['stderr'].decode(errors='replace').strip()[-2000:]}; no code was run"
            )
        exit_rec = exits[-1] if exits else {}
        exit_code = exit_rec.get("exit_code")
        cpu = exit_rec.get("cpu_seconds")
        # With no exit record (the host killed the sandbox) the CPU limit still bounds the call.
        host_cpu = cpu if cpu is not None else float(cpu_hard + 1)
        reports, forged = _read_reports(out["reports"], n_cells, wall, host_cpu)
        last = reports[-1] if len(reports) == n_cells else None
        killed_reason = self._killed_reason(out, exit_rec, n_cells, len(reports), forged)
        return SandboxResult(
            stdout=streams["stdout"].decode(errors="replace"),
            stderr=streams["stderr"].decode(errors="replace"),
            truncated=out["truncated"],
            exit_code=exit_code,
            timed_out=out["timed_out"],
            killed_reason=killed_reason,
            error=last.error if last else None,
            memory_error=bool(last and last.memory_error),
            completed=killed_reason is None,
            wall_seconds=wall,
            cpu_seconds=cpu,
            max_rss_bytes=exit_rec.get("max_rss_bytes"),
            cell_wall_seconds=_cell_walls(reports, out["reports"].ready or 0.0),
            cell_cpu_seconds=[min(r.cpu_seconds, host_cpu) for r in reports],
            startup_seconds=out["reports"].ready,
            stopped_seconds=out["stopped"],
            memory_limit_bytes=c.memory_bytes,
            max_output_bytes=c.max_output_bytes,
        )

    def _killed_reason(
        self, out: dict, exit_rec: dict, n_cells: int, n_reports: int, forged: str | None
    ) -> str | None:
        """Why the visible cell did not run to its end, in words; None when it did.

        What the host saw itself (its clock, the output cap, the init's wait status) comes first;
        then the runner's reports, which decide only whether the cell finished.
        """
        c = self.config
        exit_code = exit_rec.get("exit_code")
        cpu = exit_rec.get("cpu_seconds")
        if out["timed_out"] and out["reports"].ready is None:
            return f"sandbox start-up took more than {c.startup_seconds:g} s (a loaded host?); no code ran"
        if out["timed_out"] or exit_rec.get("deadline_expired"):
            return f"wall-clock limit of {c.wall_seconds:g} s exceeded"
        if out["truncated"]:
            return f"output limit of {c.max_output_bytes} bytes exceeded"
        if exit_code is not None and exit_code < 0:
            sig = -exit_code
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= c.cpu_seconds - 0.1):
                return f"CPU time limit of {c.cpu_seconds} s exceeded"
            return f"the process was killed by {_signal_name(sig)}"
        if forged is not None:
            return f"the sandbox's report channel held a forged or malformed report ({forged}); the call is void"
        if n_reports < n_cells:
            if n_reports < n_cells - 1:
                return (
                    f"replaying earlier cells failed after {n_reports} of {n_cells - 1} (exit code {exit_code})"
                )
            return f"the process exited with code {exit_code} before the cell finished"
        return None


def run_python(code: str, config: SandboxConfig | None = None, state: Sequence[str] = ()) -> SandboxResult:
    """Runs one cell in a fresh sandbox after replaying the cells in `state` (a session snapshot)."""
    return PythonSandbox(config).run(code, history=tuple(state))
