"""PID 1 of one sandbox: prepares the mount namespace as root, then runs the cell runner unprivileged.

Started by `trace_core.envs.sandbox.python_sandbox` as

    env -i unshare --net --pid --mount --ipc --uts --fork --mount-proc --kill-child \
        <python> -I -S _sandbox_init.py <spec-json>

so it runs as root inside fresh network, PID, mount, IPC and UTS namespaces, with a /proc that shows
only this namespace. It must stay stdlib-only (it runs with ``-S``) and import nothing from trace_core.

Steps, in order:
1. everything the cell may see of the host is opened first: the interpreter's directories (the
   venv, its base Python, /usr and the top-level library directories), the runner's source and a
   few files of /etc (the loader cache, the time zone);
2. System V IPC limits of the new IPC namespace: shared memory bounded like /dev/shm, no message
   queues;
3. a fresh tmpfs becomes the new root (pivot_root; the host's tree is detached, so no other host
   folder exists for the cell: not the checkout, not the host's /tmp, not home). In it: those
   directories as read-only overlays (a lock the cell takes is on the overlay's inode, never the
   host's), /etc with copies and a minimal passwd and group, the runner, /dev with its own device
   nodes and a private /dev/shm, a private /tmp (both size- and inode-capped), a fresh /proc;
4. the whole mount tree becomes read-only and nosuid (mount_setattr with AT_RECURSIVE), then /tmp
   and /dev/shm are made writable again;
5. fork: the child drops to the unprivileged uid/gid (no groups, no capabilities, no_new_privs),
   installs a seccomp filter (no memfds, no new namespaces), sets its rlimits and execs the
   runner; the parent waits and writes the exact wait status and resource usage as one JSON line
   on the status fd. When this process exits the kernel kills every other process in the PID
   namespace, so nothing the code started can outlive the call. An alarm kills the runner a
   little after the host's own deadline, in case the host is gone.

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
import stat
import sys

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MNT_DETACH = 0x2
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_REMOUNT = 0x20

AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
SYS_MOUNT_SETATTR = 442  # same number on every architecture (added in Linux 5.12)

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38
CLONE_NEW_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

# Per architecture: the audit arch seccomp sees and the syscall numbers used here.
_ARCHES = {
    "x86_64": {"audit_arch": 0xC000003E, "memfd_create": 319, "memfd_secret": 447, "unshare": 272, "setns": 308,
               "clone": 56, "clone3": 435, "pivot_root": 155},
    "aarch64": {"audit_arch": 0xC00000B7, "memfd_create": 279, "memfd_secret": 447, "unshare": 97, "setns": 268,
                "clone": 220, "clone3": 435, "pivot_root": 41},
}
_DEVICES = (("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9))  # major 1 (mem)
_SYSCALLS = _ARCHES.get(os.uname().machine, {})


def _load_libc() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)  # glibc; find_library would spawn ldconfig (~30 ms)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


_libc = _load_libc()
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.syscall.restype = ctypes.c_long
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


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


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, mode)


def _set_ipc_limits(spec: dict) -> None:
    """System V IPC limits of this call's IPC namespace: shared memory bounded like /dev/shm, no
    message queues (their bytes are kernel memory that no limit of the cell would count)."""
    pages = max(1, spec["shm_size_bytes"] // os.sysconf("SC_PAGE_SIZE"))
    for name, value in (("shmmax", spec["shm_size_bytes"]), ("shmall", pages), ("shmmni", 16), ("msgmni", 0)):
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(str(value))


def _setup_mounts(spec: dict) -> None:
    """Builds the cell's whole view on a fresh tmpfs and makes it the root (see the module docstring)."""
    # Everything taken from the host is opened first, while the host's view is still there.
    held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in spec["expose"]]
    devices = {name: os.open(f"/dev/{name}", os.O_PATH) for name, _ in _DEVICES}
    with open(spec["runner"], "rb") as f:
        runner_source = f.read()
    etc = {}
    for name in spec["etc_copies"]:
        if os.path.lexists(f"/etc/{name}"):
            etc[name] = os.readlink(f"/etc/{name}") if os.path.islink(f"/etc/{name}") else None
            if etc[name] is None:
                with open(f"/etc/{name}", "rb") as f:
                    etc[name] = f.read(1 << 20)
    _set_ipc_limits(spec)
    # An empty lower layer for the read-only overlays, outside the new root.
    stage = "/dev/shm"
    _mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=16,mode=700")
    os.mkdir(f"{stage}/empty", 0o755)
    root = "/tmp"
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    inodes = spec["max_files"]
    # The cell's private /tmp before the host's folders: one of them under the host's /tmp (a
    # checkout or a venv there) is then mounted inside it, read-only, instead of hidden by it.
    os.mkdir(f"{root}/tmp")
    _mount("tmpfs", f"{root}/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={spec['tmp_size_bytes']},nr_inodes={inodes},mode=1777")
    for path, fd in held:
        # A read-only overlay rather than a bind mount: the cell reads the host's files, but a lock it
        # takes is on the overlay's inode, which no host process ever locks.
        target = root + path
        os.makedirs(target, 0o755, exist_ok=True)
        _mount("overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
               f"lowerdir=/proc/self/fd/{fd}:{stage}/empty")
        os.close(fd)
    for path, target in spec["links"].items():
        os.symlink(target, root + path)
    os.mkdir(f"{root}/etc", 0o755)
    for name, data in etc.items():
        if isinstance(data, str):
            os.symlink(data, f"{root}/etc/{name}")
        else:
            _write(f"{root}/etc/{name}", data, 0o644)
    _write(f"{root}/etc/passwd", spec["passwd"].encode(), 0o644)
    _write(f"{root}/etc/group", spec["group"].encode(), 0o644)
    os.makedirs(root + os.path.dirname(spec["runner_inside"]), 0o755, exist_ok=True)
    _write(root + spec["runner_inside"], runner_source, 0o644)
    # /dev: the few devices Python and its libraries open, as device nodes of this tmpfs (not the
    # host's inodes), and a private /dev/shm.
    os.mkdir(f"{root}/dev", 0o755)
    _mount("tmpfs", f"{root}/dev", "tmpfs", MS_NOSUID, "size=64k,nr_inodes=64,mode=755")
    for name, minor in _DEVICES:
        node = f"{root}/dev/{name}"
        try:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
            os.chmod(node, 0o666)
        except PermissionError:  # no CAP_MKNOD (a pod that grants only what it must): bind the host's
            _write(node, b"", 0o666)
            _mount(f"/proc/self/fd/{devices[name]}", node, None, MS_BIND)
    for fd in devices.values():
        os.close(fd)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(f"{root}/dev/shm")
    _mount("tmpfs", f"{root}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={spec['shm_size_bytes']},nr_inodes={inodes},mode=1777")
    os.mkdir(f"{root}/proc", 0o555)
    _mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # pivot_root(".", "."): the old root ends up on top of the new one and is then detached; the
    # overlays keep their layers, nothing else of the host stays reachable.
    os.chdir(root)
    _check(int(_libc.syscall(ctypes.c_long(_SYSCALLS["pivot_root"]), b".", b".")), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount2 old root")
    os.chdir("/")
    _make_readonly_except(["/tmp", "/dev/shm"])
    work = spec["workdir"]
    os.mkdir(work, 0o700)
    os.chown(work, spec["uid"], spec["gid"])


def _seccomp_filter() -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp program: what the cell may not do even as an unprivileged uid.

    - memfd_create / memfd_secret fail (EPERM): a memfd's pages are charged to no limit of the cell
      (not RLIMIT_AS unless mapped, not the tmpfs sizes), so 384 MiB could be held under 256 MiB;
    - no new namespaces (unshare, setns, clone with a CLONE_NEW* flag: EPERM; clone3, whose flags a
      filter cannot read, ENOSYS so that libc falls back to clone): an unprivileged user namespace
      would let the cell mount a tmpfs of its own, without the size and inode caps set here;
    - any other ABI (i386 or x32 calls on x86_64) fails with ENOSYS, so none of the above is
      reachable under another syscall number.
    """
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    nr = _SYSCALLS
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, nr["audit_arch"]), (ret, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
            (ld_abs, 0, 0, 0)]
    if os.uname().machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)]
    for name, errno in (("memfd_create", EPERM), ("memfd_secret", EPERM), ("unshare", EPERM), ("setns", EPERM),
                        ("clone3", ENOSYS)):
        prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, SECCOMP_RET_ERRNO | errno)]
    prog += [(jeq, 0, 3, nr["clone"]), (ld_abs, 0, 0, 16), (jset, 0, 1, CLONE_NEW_NAMESPACES),
             (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM), (ret, 0, 0, SECCOMP_RET_ALLOW)]
    return prog


def _install_seccomp() -> None:
    prog = _seccomp_filter()
    filters = (_SockFilter * len(prog))(*[_SockFilter(code, jt, jf, k) for code, jt, jf, k in prog])
    fprog = _SockFprog(len(prog), filters)
    ret = _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                      ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p), ctypes.c_ulong(0), ctypes.c_ulong(0))
    _check(ret, "prctl(SECCOMP)")


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
    _install_seccomp()
    for name, value in spec["rlimits"].items():
        res = getattr(resource, name)
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(res, (soft, hard))
    os.chdir(spec["workdir"])
    # With known site dirs the runner skips `site` (-S): .pth processing costs ~35 ms a call here
    flags = ["-S", "-s", "-P", "-B"] if spec["site_dirs"] is not None else ["-s", "-P", "-B"]
    os.execve(spec["python"], [spec["python"], *flags, spec["runner_inside"]], spec["env"])


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
        if not _SYSCALLS:
            raise RuntimeError(f"no seccomp filter for the {os.uname().machine} architecture")
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
