"""A sandbox for model-written Python, and the stateful `python` tool built on it.

Isolation (each layer below was tried against hostile programs; `tests/test_sandbox.py`). Each call starts

    unshare --net --pid --mount --ipc --uts --fork --mount-proc --kill-child  (empty environment)
      └─ _sandbox_init.py   root, PID 1 of the namespace: private tmpfs /tmp and /dev/shm, whole
         │                  mount tree read-only + nosuid, minimal /etc/passwd
         └─ _sandbox_runner.py   uid/gid dropped (no groups, no capabilities, no_new_privs), rlimits
                                 for CPU, address space, file size, processes, open files, no core

and the host enforces the wall clock and the output cap. What that gives:

- no network: a new network namespace has only a loopback device, which is down;
- no writes outside a private tmpfs: every mount is read-only, /tmp and /dev/shm are fresh tmpfs
  (size-capped) that vanish with the call;
- no host environment: the wrapper chain starts from ``env={}``, the code gets only `_base_env()`;
  the host's processes (and their /proc/<pid>/environ) are invisible in the new PID namespace;
- nothing survives: when the init exits (or the host kills it at the deadline) the kernel kills
  every process left in the PID namespace, daemons included, and `run` returns only after that;
- process limits that hold: RLIMIT_NPROC is ignored for root, so the code runs as an unprivileged uid.

Only util-linux `unshare` is needed (the uid drop and rlimits are done by the init itself, so
`setpriv`/`prlimit` are not). Everything here runs as root; without root (in a Kubernetes pod: root
with CAP_SYS_ADMIN, or a gVisor/Kata runtime class) `PythonSandbox` raises
`SandboxUnavailableError` instead of running anything unconfined. A self-test at construction checks
that the isolation actually holds (dropped uid, no network device but lo, read-only /) before any
model code runs.

Tool state across turns. `PythonToolSession` keeps variables between the cells of one episode by
deterministic replay: the state after a prefix of turns *is* the list of cells that completed in
it, and every call runs those cells again (output discarded) before the new one, in a fresh sandbox.
Why replay rather than a long-lived interpreter with snapshots:
- a snapshot is a tuple of strings: JSON-serialisable, storable in a rollout-tree node, restorable
  in any worker process or machine, and free to branch K ways from one anchor (TRACE's prefix
  expansion restores the same prefix many times);
- every call gets a fresh sandbox, so no process outlives a call and a crash or kill costs only
  that cell; pickling an interpreter's state (dill) fails on modules, generators, open files;
- the price is re-running the prefix: O(turns) per call, small for math cells (milliseconds each).
Replay is exact when cells are deterministic. `random` is seeded and PYTHONHASHSEED fixed; code that
reads the clock, os.urandom or an unseeded numpy Generator gets fresh values on replay. Cells that
were stopped (wall clock, CPU, output cap, crash) are not part of the state, as if a notebook kernel
had been restarted with the cells that did finish.

Accounting the code cannot inflate. The runner reports each cell on a pipe (fd 3) that the cell's
own code can write to as well, so nothing on it is believed. The host accounts from what it
measures itself: a cell's wall time is the host clock between reading the report that ends the
cell before it and the report that ends it; its CPU time is at most the call's CPU as the init
measured it (wait4 of the runner), and the runner's own figure can only lower it; each is also cut
at the cell's own limit. A replay is granted `replay_time_factor` times the sum of those figures
(plus a fixed slack for the wall clock), so no grant exceeds a fixed factor of host-measured time,
nor `replay_time_factor` x the cells' limits, whatever the code writes; and the whole snapshot's
grant is capped at `max_replay_seconds`, however many cells it holds (a forged snapshot of 1,000
cells buys no more than one of three).
No clock of the call starts before the runner's first line, written before any cell runs (so
before any code could write the channel): sandbox start-up, which takes ~0.1 s on an idle host and
seconds on a loaded one, is bounded by `startup_seconds` of its own and never counts against a
cell or a replay. The visible cell's wall clock starts when the replay's last report is read, so a
replay that finishes early lends it nothing, and a report forged early only shortens it. Reports are parsed
defensively: a line that is not a well-formed report of the next cell, with finite times no larger
than the host measured for the whole call, voids the call (a stopped cell and a tool error for the
agent, never an exception in the host and never extra time).
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import site
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_INIT = _HERE / "_sandbox_init.py"
_RUNNER = _HERE / "_sandbox_runner.py"

_UNSHARE_FLAGS = ("--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child")
_WORKDIR = "/tmp/w"
_READ_CHUNK = 65536
_INIT_DEADLINE_GRACE_S = 2.0  # the init's own alarm, a backstop should the host die mid-call
_RUNNER_CHANNEL_CAP = 1 << 20  # bytes of bookkeeping records read from the runner before ignoring it
_MAX_REPORT_BYTES = 16 << 10  # a genuine report is < 4 kB (its error text is cut at 500 characters)
_MAX_ERROR_CHARS = 500
_READY_LINE = b'{"from": "runner", "kind": "ready"}'  # the runner's first line, before any cell
_REPORT_TOLERANCE_S = 0.05  # clock granularity between the runner's figures and the host's
_REPORT_KEYS = ("kind", "index", "error", "memory_error", "wall_seconds", "cpu_seconds")


class SandboxUnavailableError(RuntimeError):
    """The isolation this module promises cannot be set up here; no code was run."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and identity of one sandboxed Python cell.

    cpu_seconds: CPU time (user + system) the visible cell may use, in whole seconds
        (RLIMIT_CPU; SIGXCPU then SIGKILL). A replay is granted a multiple of the CPU its cells were
        measured to use on top (see `PythonToolSession`).
    wall_seconds: wall-clock time of the visible cell, counted from the end of the replay (from
        the end of start-up when there is none); the host kills the whole namespace when it
        passes, and in any case once the call has run wall_seconds plus the replay's grant after
        start-up, a multiple of its cells' measured time (see `PythonToolSession`).
    startup_seconds: the most wall-clock time sandbox start-up (namespaces, mounts, the
        interpreter, reading the job) may take before the runner's first line; ~0.1 s on an idle
        host, seconds on a loaded one. It counts against no cell; past it the call is stopped
        before any code ran.
    memory_bytes: address space per process (RLIMIT_AS). Allocations beyond it raise MemoryError.
        The most one call can hold is about max_processes * memory_bytes + tmp_bytes + shm_bytes.
    max_output_bytes: stdout + stderr bytes the agent sees; a cell that prints more is stopped and
        its output cut there.
    max_processes: processes + threads of one call (RLIMIT_NPROC). The kernel counts it per uid, so
        every concurrent call runs as a uid of its own (see `uid_count`): a fork bomb exhausts only
        its own call's limit, never a neighbour's.
    max_file_bytes: largest file the code may write (RLIMIT_FSIZE).
    max_open_files: open file descriptors per process (RLIMIT_NOFILE).
    tmp_bytes: size of the private tmpfs mounted on /tmp (the working directory is /tmp/w).
    shm_bytes: size of the private tmpfs mounted on /dev/shm (and of System V shared memory).
    max_files: inodes (files, directories, links) of each of the private /tmp and /dev/shm, so
        that a cell cannot grow the kernel's memory by creating files (~1 kB each) past this.
    uid: first of the unprivileged uids the code runs as (never 0: root ignores RLIMIT_NPROC).
    uid_count: size of the uid pool from `uid`: each call holds one uid of it exclusively, across
        every process of the host, for its whole life; a call waits while all are in use.
        Nothing else on the host should run as these uids (their processes would count too).
    gid: unprivileged gid the code runs as.
    python: interpreter for the code; the project's venv by default (numpy, sympy available).
        It must be readable by `uid`; directories above it that are not (a base Python under /root)
        are bind-mounted into the sandbox, with the rest of that directory hidden.
    seed: seed of `random` and PYTHONHASHSEED, so replayed cells reproduce their values.
    echo_last_expression: print the repr of a cell's final expression, as a notebook does.
    extra_env: additional environment variables for the code, as (name, value) pairs.
    """

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    startup_seconds: float = 30.0
    memory_bytes: int = 1 << 30
    max_output_bytes: int = 16 << 10
    max_processes: int = 32
    max_file_bytes: int = 16 << 20
    max_open_files: int = 256
    tmp_bytes: int = 64 << 20
    shm_bytes: int = 16 << 20
    max_files: int = 4096
    uid: int = 65534
    uid_count: int = 64
    gid: int = 65534
    python: str = sys.executable
    seed: int = 0
    echo_last_expression: bool = True
    extra_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        positive = (
            "cpu_seconds",
            "wall_seconds",
            "startup_seconds",
            "memory_bytes",
            "max_output_bytes",
            "max_processes",
            "max_file_bytes",
            "max_open_files",
            "tmp_bytes",
            "shm_bytes",
            "max_files",
            "uid_count",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not isinstance(self.cpu_seconds, int):
            raise ValueError(
                f"SandboxConfig.cpu_seconds must be a whole number of seconds, got {self.cpu_seconds!r}"
            )
        for name in ("uid", "gid"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"SandboxConfig.{name} must be an unprivileged id (> 0), got {getattr(self, name)}"
                )
        if self.uid + self.uid_count > (1 << 31):
            raise ValueError(f"SandboxConfig.uid + uid_count must stay below 2**31, got {self.uid + self.uid_count}")
        for pair in self.extra_env:
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair) or "=" in pair[0] or not pair[0]:
                raise ValueError(
                    f"SandboxConfig.extra_env entries must be (name, value) strings, got {pair!r}"
                )


@dataclass
class SandboxResult:
    """What one sandboxed call produced, seen from the host.

    stdout/stderr: the visible cell's output, decoded as UTF-8 (invalid bytes replaced), cut at the cap.
    truncated: the output went past `max_output_bytes` (the cell was then stopped).
    exit_code: the runner's exit status (negative: killed by that signal); None if it never
        reported (the host killed the sandbox first).
    timed_out: the wall-clock limit passed and the host killed the sandbox.
    killed_reason: why the cell did not run to its end, in words; None when it did.
    error: the visible cell's exception as "Type: message", None if it raised nothing.
    memory_error: that exception was a MemoryError (the memory limit was reached).
    completed: the visible cell ran to its end (with or without an exception); only such cells
        become part of a tool session's state.
    wall_seconds: host-measured time of the whole call, start-up included.
    startup_seconds: host clock from the call's start to reading the runner's first line (written
        before any cell runs); None when it never came.
    stopped_seconds: host clock from the call's start to the moment the host stopped it (wall
        clock or output cap), before the teardown that `wall_seconds` includes; None when the host
        did not stop it.
    cpu_seconds: CPU time of the runner and the children it waited for (all cells of the call), as
        the init measured it; None when the host killed the sandbox first.
    max_rss_bytes: peak resident memory of the runner.
    cell_wall_seconds: per reported cell, the host clock between reading the report before it (or
        the runner's first line) and reading its own; only cells with a well-formed report in order.
    cell_cpu_seconds: per reported cell, the runner's figure, but never more than this call's
        `cpu_seconds` (or its CPU limit, when that is unknown): the code can write the figure, so
        it can only ever lower what a replay is granted.
    """

    stdout: str
    stderr: str
    truncated: bool
    exit_code: int | None
    timed_out: bool
    killed_reason: str | None
    error: str | None
    memory_error: bool
    completed: bool
    wall_seconds: float
    cpu_seconds: float | None
    max_rss_bytes: int | None
    cell_wall_seconds: list[float] = field(default_factory=list)
    cell_cpu_seconds: list[float] = field(default_factory=list)
    startup_seconds: float | None = None
    stopped_seconds: float | None = None
    memory_limit_bytes: int = 0
    max_output_bytes: int = 0

    @property
    def observation(self) -> str:
        """The text the agent reads: output, then one bracketed line per thing that went wrong."""
        parts = []
        body = self.stdout
        if self.stderr:
            body = body + ("" if not body or body.endswith("\n") else "\n") + self.stderr
        if body:
            parts.append(body.rstrip("\n"))
        if self.truncated:
            parts.append(f"[output truncated: the cell printed more than {self.max_output_bytes} bytes]")
        if self.memory_error:
            parts.append(f"[memory limit reached: {self.memory_limit_bytes // (1 << 20)} MiB per process]")
        if self.killed_reason:
            parts.append(f"[execution stopped: {self.killed_reason}]")
        if not parts:
            parts.append("(no output)")
        return "\n".join(parts)


_TOP_LEVEL_LIBRARY_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_COPIES = ("ld.so.cache", "localtime")  # copied into the cell's /etc; nothing else of the host's
_RUNNER_INSIDE = "/sandbox/_sandbox_runner.py"


@dataclass(frozen=True)
class _View:
    """What a cell sees of the host: read-only directories, top-level symlinks, the interpreter."""

    expose: tuple[str, ...]  # real paths, none under another
    links: dict[str, str]  # e.g. /lib -> usr/lib, as on the host
    python: str  # the interpreter's path inside the cell: its venv's real path, the name kept
    site_dirs: list[str] | None  # site-packages to put on sys.path (our own interpreter only)


def _interpreter_view(python: str) -> _View:
    """The interpreter's directories, found by their real paths.

    A venv's `bin/python` is a symlink to its base interpreter, and Python finds the venv from the
    path it was started by: so the cell starts `<real venv>/bin/<name>` (a venv reached through a
    symlinked folder works the same), and both the venv and the base installation are exposed.
    """
    bin_dir = os.path.realpath(os.path.dirname(os.path.abspath(python)))
    inside = os.path.join(bin_dir, os.path.basename(python))
    real = os.path.realpath(python)
    dirs = {"/usr", os.path.dirname(bin_dir), os.path.dirname(os.path.dirname(real))}
    site_dirs = None
    if os.path.realpath(python) == os.path.realpath(sys.executable) and os.path.realpath(
        os.path.dirname(sys.executable)
    ) == bin_dir:
        dirs |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
        site_dirs = [os.path.realpath(d) for d in site.getsitepackages()]
        dirs |= {d for d in site_dirs if os.path.isdir(d)}
    links = {}
    for top in _TOP_LEVEL_LIBRARY_DIRS:
        if os.path.islink(top):
            links[top] = os.readlink(top)
        elif os.path.isdir(top):
            dirs.add(top)
    kept: list[str] = []
    for d in sorted(dirs - {"/"}):
        if os.path.isdir(d) and not any(d == k or d.startswith(k + "/") for k in kept):
            kept.append(d)
    for d in kept:
        if not os.stat(d).st_mode & 0o005 == 0o005:
            raise SandboxUnavailableError(
                f"{d} (needed by the sandbox interpreter) is not readable by other users; make it "
                "world-readable or use an interpreter installed outside private directories"
            )
    return _View(tuple(kept), links, inside, site_dirs)


class _UidLease:
    """One uid of `SandboxConfig`'s pool, held for one call, exclusive among every process of the host.

    RLIMIT_NPROC counts the processes of a uid, so a uid per concurrent call makes the process
    limit per cell: one fork bomb exhausts only its own uid. The lease is an abstract unix socket
    bound to a name made of the uid: binding is exclusive within the host's network namespace and
    the kernel releases it when the holder exits, so a crashed worker never leaks a uid. The cells
    live in network namespaces of their own and cannot touch these names.
    """

    def __init__(self, first: int, count: int, wait_seconds: float = 60.0) -> None:
        deadline = time.monotonic() + wait_seconds
        while True:
            for uid in range(first, first + count):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.bind(f"\0trace-rl-sandbox-uid-{uid}")
                except OSError:
                    sock.close()
                    continue
                self.uid, self._sock = uid, sock
                return
            if time.monotonic() > deadline:
                raise SandboxUnavailableError(
                    f"all {count} sandbox uids from {first} stayed in use for {wait_seconds:g} s; "
                    "raise SandboxConfig.uid_count or run fewer concurrent cells"
                )
            time.sleep(0.005)

    def release(self) -> None:
        self._sock.close()


def _base_env(config: SandboxConfig) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": _WORKDIR,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": str(config.seed),
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    env.update(dict(config.extra_env))
    return env


class _ReportChannel:
    """The runner's report lines, each stamped with the host clock at the moment the host read it.

    The first line is the runner's `_READY_LINE`, written before any cell runs: it ends start-up,
    and is trusted because no code of the call has run yet. `lines` holds the lines after it.
    Bytes past `_RUNNER_CHANNEL_CAP` are drained but not kept (the code could write forever).
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.ready: float | None = None  # seconds since the call started that the ready line was read
        self.lines: list[tuple[float, bytes]] = []  # (seconds since the call started, line)
        self.size = 0
        self._first: bytes | None = None  # the first line, whatever it was
        self._partial = bytearray()

    def feed(self, chunk: bytes, now: float) -> None:
        self.size += len(chunk)
        if self.size > _RUNNER_CHANNEL_CAP:
            return
        self._partial += chunk
        *complete, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        for line in complete:
            if self._first is None:
                self._first = bytes(line)
                if self._first == _READY_LINE:
                    self.ready = now - self.start
                continue
            self.lines.append((now - self.start, bytes(line)))

    def problem(self) -> str | None:
        """What makes the channel as a whole unreadable, if anything."""
        if self.size > _RUNNER_CHANNEL_CAP:
            return f"more than {_RUNNER_CHANNEL_CAP} bytes of reports"
        if self._first is not None and self.ready is None:
            return "its first line is not the runner's start-up line"
        if self._partial:
            return f"an unterminated line after line {len(self.lines)}"
        return None


@dataclass(frozen=True)
class _CellReport:
    """One well-formed report from the runner; `arrived` is the host's own clock."""

    index: int
    error: str | None
    memory_error: bool
    cpu_seconds: float  # the runner's own figure: informational, only ever lowers what is granted
    arrived: float  # seconds after the call started that the host read it


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite_seconds(value: object) -> float | None:
    """`value` as seconds if it is a finite number >= 0 (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer with hundreds of digits
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _parse_report(
    raw: bytes, arrived: float, expected: int, n_cells: int, host_wall: float, host_cpu: float
) -> _CellReport | str:
    """The report of cell `expected` read at `arrived`, or what is wrong with the line, in words.

    host_wall / host_cpu: what the host measured for the whole call; no cell can have used more.
    """
    if len(raw) > _MAX_REPORT_BYTES:
        return f"a line of {len(raw)} bytes (a report has at most {_MAX_REPORT_BYTES})"
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    for key in _REPORT_KEYS:
        if key not in rec:
            return f"no {key!r}"
    if rec["kind"] != "cell":
        return f"kind {_show(rec['kind'])}, not 'cell'"
    index = rec["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index != expected:
        return f"index {_show(index)} where the report of cell {expected} (of 0..{n_cells - 1}) was due"
    for key, measured in (("wall_seconds", host_wall), ("cpu_seconds", host_cpu)):
        seconds = _finite_seconds(rec[key])
        if seconds is None:
            return f"{key} {_show(rec[key])}, not a finite number >= 0"
        if seconds > measured + _REPORT_TOLERANCE_S:
            return f"{key} {seconds:.6g}, more than the host measured for the whole call ({measured:.3f})"
    error = rec["error"]
    if error is not None and not isinstance(error, str):
        return f"error {_show(error)}, not a string or null"
    if not isinstance(rec["memory_error"], bool):
        return f"memory_error {_show(rec['memory_error'])}, not a bool"
    return _CellReport(
        index=index,
        error=None if error is None else error[:_MAX_ERROR_CHARS],
        memory_error=rec["memory_error"],
        cpu_seconds=float(rec["cpu_seconds"]),
        arrived=arrived,
    )


def _read_reports(
    channel: _ReportChannel, n_cells: int, host_wall: float, host_cpu: float
) -> tuple[list[_CellReport], str | None]:
    """The well-formed reports, in order, and the first thing wrong with the channel (None if nothing).

    Reports must be those of cells 0, 1, ... in order, one each: a duplicate, a gap or a line
    after the last cell is as wrong as a malformed one.
    """
    reports: list[_CellReport] = []
    if channel.ready is None:
        return reports, channel.problem()
    for number, (arrived, raw) in enumerate(channel.lines, 1):  # numbered after the ready line
        if len(reports) == n_cells:
            return reports, f"line {number}: a report after the last cell's"
        report = _parse_report(raw, arrived, len(reports), n_cells, host_wall, host_cpu)
        if isinstance(report, str):
            return reports, f"line {number}: {report}"
        reports.append(report)
    return reports, channel.problem()


def _cell_walls(reports: Sequence[_CellReport], ready: float) -> list[float]:
    """Host-clock seconds of each cell: from reading the report before it (or the runner's ready
    line, which ends start-up) to reading its own."""
    walls, previous = [], ready
    for report in reports:
        walls.append(max(0.0, report.arrived - previous))
        previous = report.arrived
    return walls


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


def run_python(code: str, config: SandboxConfig | None = None, state: Sequence[str] = ()) -> SandboxResult:
    """Runs one cell in a fresh sandbox after replaying the cells in `state` (a session snapshot)."""
    return PythonSandbox(config).run(code, history=tuple(state))


@dataclass(frozen=True)
class ToolSnapshot:
    """The state of a `python` tool after some turns: the cells that completed, in order.

    cell_wall_seconds / cell_cpu_seconds: what the host measured each cell to cost when it ran as
    the visible cell (see the module docstring), which bounds the time granted to replay them.
    Plain data: store it with `to_json()` in a rollout-tree node and restore anywhere.
    """

    cells: tuple[str, ...] = ()
    cell_wall_seconds: tuple[float, ...] = ()
    cell_cpu_seconds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.cells) == len(self.cell_wall_seconds) == len(self.cell_cpu_seconds)):
            raise ValueError(
                "ToolSnapshot: cells, cell_wall_seconds and cell_cpu_seconds must have equal lengths"
            )
        if not all(isinstance(cell, str) for cell in self.cells):
            raise ValueError("ToolSnapshot.cells must be strings")
        for name in ("cell_wall_seconds", "cell_cpu_seconds"):
            for i, value in enumerate(getattr(self, name)):
                if _finite_seconds(value) is None:
                    raise ValueError(f"ToolSnapshot.{name}[{i}] must be a finite number >= 0, got {value!r}")

    def to_json(self) -> dict:
        return {
            "cells": list(self.cells),
            "cell_wall_seconds": list(self.cell_wall_seconds),
            "cell_cpu_seconds": list(self.cell_cpu_seconds),
        }

    @classmethod
    def from_json(cls, data: dict) -> ToolSnapshot:
        try:
            return cls(tuple(data["cells"]), tuple(data["cell_wall_seconds"]), tuple(data["cell_cpu_seconds"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"ToolSnapshot.from_json: not a snapshot ({type(exc).__name__}: {exc})") from exc


class PythonToolSession:
    """The `python` tool of one episode: variables persist across `run` calls, by replay.

    replay_time_factor: replayed cells get this multiple of their measured time (plus
    `replay_slack_seconds` of wall clock) on top of the new cell's limits, so a loaded machine does
    not turn a finished prefix into a timeout. Each cell's figure is cut at its own limit first.
    max_replay_seconds: the most wall-clock seconds, and the most CPU seconds, a whole snapshot's
    replay is granted (slack included), whatever its number of cells: a snapshot from anywhere
    buys at most this on top of one cell's limits. A genuine episode's prefix of math cells
    replays in well under a second; one whose replay needs more is stopped as a failed replay.
    """

    def __init__(
        self,
        sandbox: PythonSandbox | None = None,
        replay_time_factor: float = 2.0,
        replay_slack_seconds: float = 0.5,
        max_replay_seconds: float = 30.0,
    ) -> None:
        if not (math.isfinite(replay_time_factor) and replay_time_factor >= 1.0):
            raise ValueError(f"replay_time_factor must be a finite number >= 1, got {replay_time_factor}")
        if _finite_seconds(replay_slack_seconds) is None:
            raise ValueError(f"replay_slack_seconds must be a finite number >= 0, got {replay_slack_seconds}")
        if _finite_seconds(max_replay_seconds) is None or max_replay_seconds < replay_slack_seconds:
            raise ValueError(
                f"max_replay_seconds must be a finite number >= replay_slack_seconds, got {max_replay_seconds}"
            )
        self.sandbox = sandbox or PythonSandbox()
        self.replay_time_factor = replay_time_factor
        self.replay_slack_seconds = replay_slack_seconds
        self.max_replay_seconds = max_replay_seconds
        self._state = ToolSnapshot()
        self.last_result: SandboxResult | None = None

    def replay_grant(self, snapshot: ToolSnapshot) -> tuple[float, float]:
        """(wall, CPU) seconds granted to replay `snapshot`'s cells on top of the new cell's limits."""
        if not snapshot.cells:
            return 0.0, 0.0
        c = self.sandbox.config
        wall = sum(min(w, c.wall_seconds) for w in snapshot.cell_wall_seconds)
        cpu = sum(min(x, float(c.cpu_seconds)) for x in snapshot.cell_cpu_seconds)
        cap = self.max_replay_seconds
        return (min(self.replay_time_factor * wall + self.replay_slack_seconds, cap),
                min(self.replay_time_factor * cpu, cap))

    def execute(self, cell: str) -> SandboxResult:
        """Runs `cell` on top of the current state; keeps it in the state if it ran to its end."""
        s = self._state
        replay_wall, replay_cpu = self.replay_grant(s)
        result = self.sandbox.run(
            cell, history=s.cells, replay_seconds=replay_wall, replay_cpu_seconds=replay_cpu
        )
        if result.completed and len(result.cell_wall_seconds) == len(s.cells) + 1:
            c = self.sandbox.config
            self._state = ToolSnapshot(
                s.cells + (cell,),
                s.cell_wall_seconds + (min(result.cell_wall_seconds[-1], c.wall_seconds),),
                s.cell_cpu_seconds + (min(result.cell_cpu_seconds[-1], float(c.cpu_seconds)),),
            )
        self.last_result = result
        return result

    def run(self, cell: str) -> str:
        """Runs `cell` and returns the observation the agent reads."""
        result = self.execute(cell)
        text = result.observation
        if not result.completed:
            text += "\n[variables are as they were before this cell]"
        return text

    def snapshot(self) -> ToolSnapshot:
        return self._state

    def restore(self, snapshot: ToolSnapshot) -> None:
        if not isinstance(snapshot, ToolSnapshot):
            raise ValueError(f"restore expects a ToolSnapshot, got {type(snapshot).__name__}")
        self._state = snapshot
