"""What a cell is confined to: the process chain and its namespaces, the read-only view of the
interpreter it sees, the uid it runs as, the environment it gets.

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
  every process left in the PID namespace, daemons included, and `run` returns only after that
  (`processes._terminate`);
- process limits that hold: RLIMIT_NPROC is ignored for root, so the code runs as an unprivileged
  uid, one of a pool per concurrent call (`_UidLease`).

Only util-linux `unshare` is needed (the uid drop and rlimits are done by the init itself, so
`setpriv`/`prlimit` are not). Everything here runs as root; without root (in a Kubernetes pod: root
with CAP_SYS_ADMIN, or a gVisor/Kata runtime class) `PythonSandbox` raises
`SandboxUnavailableError` instead of running anything unconfined. A self-test at construction checks
that the isolation actually holds (dropped uid, no network device but lo, read-only /) before any
model code runs.
"""

from __future__ import annotations

import os
import site
import socket
import sys
import time
from dataclasses import dataclass

from trace_core.envs.sandbox.config import SandboxConfig, SandboxUnavailableError

_UNSHARE_FLAGS = ("--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child")
_WORKDIR = "/tmp/w"  # the cell's working directory and HOME, in its private /tmp
_TOP_LEVEL_LIBRARY_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_COPIES = ("ld.so.cache", "localtime")  # copied into the cell's /etc; nothing else of the host's
_RUNNER_INSIDE = "/sandbox/_sandbox_runner.py"  # where the init binds the runner in the cell's root


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
