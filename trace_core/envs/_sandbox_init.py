"""PID 1 of one sandbox: prepares the mount namespace as root, then runs the cell runner unprivileged.

Started by `trace_core.envs.sandbox` as

    env -i unshare --net --pid --mount --ipc --uts --fork --mount-proc --kill-child \
        <python> -I -S _sandbox_init.py <spec-json>

so it runs as root inside fresh network, PID, mount, IPC and UTS namespaces, with a /proc that shows
only this namespace. It must stay stdlib-only (it runs with ``-S``) and import nothing from trace_core.

Steps, in order:
1. private tmpfs on /tmp (the only writable place for the code) and /dev/shm;
2. directories the interpreter needs but the dropped uid cannot traverse (a venv whose base Python
   lives under /root, mode 0700) are bind-mounted back in under a tmpfs that hides the rest of the
   masked directory;
3. a minimal /etc/passwd and /etc/group are bound over the host's;
4. the whole mount tree becomes read-only and nosuid (mount_setattr with AT_RECURSIVE), then /tmp
   and /dev/shm are made writable again;
5. fork: the child drops to the unprivileged uid/gid (no groups, no capabilities, no_new_privs),
   sets its rlimits and execs the runner; the parent waits and writes the exact wait status and
   resource usage as one JSON line on the status fd. When this process exits the kernel kills every
   other process in the PID namespace, so nothing the code started can outlive the call. An alarm
   kills the runner a little after the host's own deadline, in case the host is gone.

Any failure before the exec is reported as {"kind": "error"} and a non-zero exit: the host then
raises instead of returning an observation, so code never runs with a partial sandbox.
"""

import ctypes
import ctypes.util
import fcntl
import json
import math
import os
import resource
import signal
import sys

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_REMOUNT = 0x20

AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
SYS_MOUNT_SETATTR = 442  # same number on every architecture (added in Linux 5.12)

PR_SET_NO_NEW_PRIVS = 38


def _load_libc() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)  # glibc; find_library would spawn ldconfig (~30 ms)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


_libc = _load_libc()
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _setattr(path: str, attr_set: int, attr_clr: int, recursive: bool) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    ret = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(path.encode()),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(int(ret), f"mount_setattr {path}")


def _remount_all_readonly() -> None:
    """Fallback for kernels without mount_setattr: remount every mount point read-only, one by one."""
    keep = {"nodev": MS_NODEV, "noexec": 0x8, "nosuid": MS_NOSUID}
    with open("/proc/self/mountinfo") as f:
        entries = [line.split() for line in f]
    for fields in entries:
        target = fields[4].encode().decode("unicode_escape")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        for opt in fields[5].split(","):
            flags |= keep.get(opt, 0)
        try:
            _mount(None, target, None, flags)
        except OSError:
            if "ro" not in fields[5].split(","):
                raise  # a mount that stays writable is a hole: refuse rather than run


def _make_readonly_except(writable: list[str]) -> None:
    try:
        _setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, recursive=True)
        for path in writable:
            _setattr(path, 0, MOUNT_ATTR_RDONLY, recursive=False)
    except OSError as exc:
        if exc.errno not in (38,):  # ENOSYS: kernel older than 5.12
            raise
        _remount_all_readonly()
        for path in writable:
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)


def _setup_mounts(spec: dict) -> None:
    # Interpreter/package directories that live under /tmp or /dev/shm (a checkout or venv there)
    # would vanish under the fresh tmpfs: hold them by O_PATH descriptors and bind them back.
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in spec.get("preserve", [])]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_size_bytes']},mode=1777")
    for path, fd in held:
        if path.startswith("/tmp/"):
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    stage = "/tmp/.stage"
    os.mkdir(stage, 0o700)
    staged: list[tuple[str, str]] = []
    for i, group in enumerate(spec["expose"]):
        for j, path in enumerate(group["paths"]):
            slot = f"{stage}/{i}_{j}"
            os.mkdir(slot)
            _mount(path, slot, None, MS_BIND | MS_REC)
            staged.append((slot, path))
        _mount("tmpfs", group["mask"], "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for slot, path in staged:
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(slot, path, None, MS_MOVE)
            os.rmdir(slot)
        staged.clear()
    for name, text in (("passwd", spec["passwd"]), ("group", spec["group"])):
        src = f"{stage}/{name}"
        with open(src, "w") as f:
            f.write(text)
        os.chmod(src, 0o644)
        _mount(src, f"/etc/{name}", None, MS_BIND)
        os.unlink(src)
    os.rmdir(stage)
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['shm_size_bytes']},mode=1777")
    for path, fd in held:
        if path.startswith("/dev/shm/"):
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    _make_readonly_except(["/tmp", "/dev/shm"])  # the bound-back directories stay read-only
    work = spec["workdir"]
    os.mkdir(work, 0o700)
    os.chown(work, spec["uid"], spec["gid"])


def _exec_runner(spec: dict, job_r: int) -> None:
    """Child side: becomes the unprivileged process that runs the cells. Never returns.

    fd 3 of the runner is the host's runner channel. The init channel stays open only until the
    exec (close-on-exec), so a failure before it can still be reported there, and the code can never
    write a record the host would take for one of ours.
    """
    init_fd = int(spec["init_fd"])
    os.dup2(job_r, 0)
    os.dup2(int(spec["runner_fd"]), 3)  # dup2 makes fd 3 inheritable; init_fd is close-on-exec
    os.closerange(4, init_fd)
    os.closerange(init_fd + 1, 1 << 16)
    os.set_inheritable(3, True)
    uid, gid = spec["uid"], spec["gid"]
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # from root to non-root: permitted/effective/ambient caps are cleared
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise RuntimeError("privileges were not dropped: setuid(0) succeeded")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    for name, value in spec["rlimits"].items():
        res = getattr(resource, name)
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(res, (soft, hard))
    os.chdir(spec["workdir"])
    # With known site dirs the runner skips `site` (-S): .pth processing costs ~35 ms a call here
    flags = ["-S", "-s", "-P", "-B"] if spec["site_dirs"] is not None else ["-s", "-P", "-B"]
    os.execve(spec["python"], [spec["python"], *flags, spec["runner"]], spec["env"])


def main() -> int:
    spec = json.loads(sys.argv[1])
    for key in ("init_fd", "runner_fd"):  # move the host's channels above the fds the child rewires
        high = fcntl.fcntl(int(spec[key]), fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(int(spec[key]))
        spec[key] = high
    status_fd = spec["init_fd"]
    job = sys.stdin.buffer.read()

    def report(record: dict) -> None:
        os.write(status_fd, (json.dumps({"from": "init", **record}) + "\n").encode())

    try:
        if os.getpid() != 1:
            raise RuntimeError(f"not the first process of a new PID namespace (pid {os.getpid()})")
        _setup_mounts(spec)
        job_r, job_w = os.pipe()
    except Exception as exc:  # noqa: BLE001 - every setup failure must reach the host as a refusal
        report({"kind": "error", "stage": "setup", "message": f"{type(exc).__name__}: {exc}"})
        return 70

    pid = os.fork()
    if pid == 0:
        try:
            os.close(job_w)
            _exec_runner(spec, job_r)
        except BaseException as exc:  # noqa: BLE001 - report, then die without running any code
            report({"kind": "error", "stage": "exec", "message": f"{type(exc).__name__}: {exc}"})
        os._exit(71)

    os.close(job_r)
    # Backstop for the host's wall clock (which fires first): if the host dies, nothing else would
    # stop a cell that sleeps, since RLIMIT_CPU only bounds computing.
    expired = []

    def on_deadline(signum, frame) -> None:
        expired.append(True)
        os.kill(pid, signal.SIGKILL)

    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(max(1, math.ceil(float(spec["deadline_seconds"]))))
    try:
        view = memoryview(job)
        while view:
            view = view[os.write(job_w, view) :]
    except BrokenPipeError:
        pass
    os.close(job_w)
    _, status, usage = os.wait4(pid, 0)  # retried after the alarm handler (PEP 475)
    signal.alarm(0)
    record = {
        "kind": "exit",
        "deadline_expired": bool(expired),
        "exit_code": os.waitstatus_to_exitcode(status),
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "max_rss_bytes": usage.ru_maxrss * 1024,
    }
    report(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
