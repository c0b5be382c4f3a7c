"""What one sandbox call is given and what it gives back: its limits and identity (`SandboxConfig`),
what the host observed of it (`SandboxResult`), and the error for a host where no sandbox can be
built (`SandboxUnavailableError`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


class SandboxUnavailableError(RuntimeError):
    """The isolation this package promises cannot be set up here; no code was run."""


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
