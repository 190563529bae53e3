"""Thin ctypes bindings for the kernel calls Python's stdlib lacks: prctl, unshare,
Landlock and seccomp. Each returns or raises OSError; callers decide what a refusal means."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import stat
from typing import Any, Literal

from ..sandbox.long_paths import reachable

_libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter is linked with
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000

# Landlock syscall numbers are the same on every architecture (added after the unification).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4

READ = FS_READ_FILE | FS_READ_DIR
READ_EXEC = READ | FS_EXECUTE


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0))


def last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def clear_inheritable(keep: set[int]) -> None:
    """Drop every inheritable capability but ``keep`` (effective and permitted unchanged)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data))
    mask = [0, 0]
    for cap in keep:
        mask[cap // 32] |= 1 << (cap % 32)
    if all(data[i].inheritable & ~mask[i] == 0 for i in range(2)):
        return
    for i in range(2):
        data[i].inheritable &= mask[i]
    _check(_libc.capset(ctypes.byref(header), data))


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags))


MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_RELATIME = 1 << 21
# statvfs f_flag bits → the mount flags a remount must repeat (a user namespace may not drop them)
_KEPT_MOUNT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC, os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME,
}  # fmt: skip


def unshare_as_same_uid(flags: int) -> None:
    """Unshare ``flags`` inside a new user namespace that maps only our own uid and gid,
    so files keep their owner and nothing gains a privilege outside."""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | flags)
    # A process that is not dumpable (the daemon's hardening, inherited; or the kernel's
    # rule after setuid) finds /proc/self owned by root and may not write its own maps:
    # the namespace would stay unmapped and everything in it would run as the overflow
    # uid. Dumpable only while the maps are written.
    prctl(PR_SET_DUMPABLE, 1)
    try:
        _write_text("/proc/self/setgroups", "deny")
        _write_text("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_text("/proc/self/gid_map", f"{gid} {gid} 1")
    finally:
        prctl(PR_SET_DUMPABLE, 0)


def _write_text(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mount(source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None) -> None:
    _check(
        _libc.mount(
            os.fsencode(source) if source else None,  # (a name need not be UTF-8)
            os.fsencode(target),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        )
    )


def loopback_up() -> None:
    """Bring the loopback interface of this network namespace up (needs CAP_NET_ADMIN in
    the namespace: its creator has it)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock, siocgifflags, struct.pack("16sh", b"lo", 0) + b"\0" * 22)
        flags = struct.unpack_from("16sh", current)[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up) + b"\0" * 22)


def make_mounts_private() -> None:
    """Stop mounts made in this (new) namespace from propagating back to the host."""
    mount(None, "/", MS_REC | MS_PRIVATE)


def bind_read_only(path: str) -> None:
    """Make ``path`` (and everything below it) read-only in this mount namespace."""
    with reachable(path) as target:
        mount(target, target, MS_BIND | MS_REC)
    _remount_read_only(path)


def bind_writable(path: str) -> None:
    """Make ``path`` writable again below a read-only bind (its submounts keep their own
    flags: a read-only ``.git`` inside stays read-only)."""
    with reachable(path) as target:
        mount(target, target, MS_BIND | MS_REC)
    with reachable(path) as target:  # (found again: now the new mount)
        kept = os.statvfs(target).f_flag
        flags = MS_BIND | MS_REMOUNT | sum(ms for st, ms in _KEPT_MOUNT_FLAGS.items() if kept & st)
        mount(None, target, flags)


def _remount_read_only(path: str) -> None:
    """Make the bind mount at ``path`` read-only, keeping the flags the kernel locked on it
    (a user namespace may not clear nosuid, nodev, …)."""
    with reachable(path) as target:  # (found again: the mount just made there)
        kept = os.statvfs(target).f_flag
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        flags |= sum(ms for st, ms in _KEPT_MOUNT_FLAGS.items() if kept & st)
        mount(None, target, flags)


def hide_file(path: str) -> None:
    """Show ``path`` (a regular file) as ``/dev/null`` in this mount namespace: reads find
    nothing, writes go nowhere, the file on disk is untouched."""
    with reachable(path) as target:
        mount("/dev/null", target, MS_BIND)
    _remount_read_only(path)


def hide_directory(path: str) -> None:
    """Show ``path`` (a directory) as an empty, read-only one in this mount namespace."""
    with reachable(path) as target:
        mount("toold-hidden", target, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "tmpfs", "size=4k,mode=0555")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or 0 when Landlock is missing or disabled."""
    try:
        return _check(
            _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION)
        )
    except OSError:
        return 0


def fs_access_for_abi(abi: int) -> int:
    """Every filesystem right this ABI can restrict (so everything not granted is denied)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6


def landlock_scopes(abi: int) -> bool:
    """Whether a ruleset can keep signals and abstract Unix sockets inside its domain
    (ABI 6, Linux 6.12)."""
    return abi >= 6


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_denies_tcp(abi: int) -> bool:
    """Whether a ruleset can forbid TCP bind/connect (ABI 4, Linux 6.7)."""
    return abi >= 4


def landlock_ruleset(rules: list[tuple[str, int]], abi: int, *, deny_tcp: bool = False) -> int:
    """A ruleset fd granting ``rules`` (path, rights) and denying every other handled right.
    Paths that do not exist are skipped; a right the ABI lacks is dropped. With
    ``deny_tcp`` (and ABI 4) TCP bind and connect are handled with no port allowed.
    From ABI 6 the domain is also scoped: nothing inside it can signal a process outside
    it or connect to an abstract Unix socket made outside it. Building one costs about a
    millisecond, so the spawner builds it once and children only apply it."""
    handled = fs_access_for_abi(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if deny_tcp and landlock_denies_tcp(abi) else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if landlock_scopes(abi) else 0
    attr = _RulesetAttr(handled, net, scoped)
    size = 8 * 3 if landlock_scopes(abi) else 8 * 2 if abi >= 4 else 8
    ruleset = _check(_libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0))
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
                os.close(fd)  # a pipe or socket (Landlock refuses those with EBADFD)
                continue
            try:
                granted = rights & handled
                if not stat.S_ISDIR(mode):  # a file: only rights that apply to files
                    granted &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
                beneath = _PathBeneath(granted, fd)
                _check(
                    _libc.syscall(
                        _SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(beneath), 0
                    )
                )
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def landlock_restrict_self(ruleset: int) -> None:
    """Apply a ruleset to this process (and everything it will start). Needs no_new_privs."""
    _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0))


# ---- seccomp ---------------------------------------------------------------------------

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscalls a tool never needs and that reach across process or kernel boundaries.
_DENIED_SYSCALLS = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321, "perf_event_open": 298,
        "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169,
        "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304, "fsopen": 430,
        "fsmount": 432, "move_mount": 429, "pivot_root": 155, "swapon": 167, "swapoff": 168,
        "tkill": 200, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280, "perf_event_open": 241,
        "keyctl": 219, "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142,
        "kexec_load": 104, "kexec_file_load": 294, "open_by_handle_at": 265, "fsopen": 430,
        "fsmount": 432, "move_mount": 429, "pivot_root": 41, "swapon": 224, "swapoff": 225,
        "tkill": 130, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    },
}  # fmt: skip
_SOCKET_NR = {"x86_64": 41, "aarch64": 198}
# Syscalls whose first argument names the process they signal (or, pidfd_open, reach).
_TARGETED = {
    "x86_64": {"kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434},
    "aarch64": {"kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_open": 434},
}
_AF_UNIX = 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO_EPERM = 0x00050000 | 1
_RET_KILL_PROCESS = 0x80000000


def seccomp_supported() -> str | None:
    """None when a filter can be built for this machine, else why not."""
    machine = platform.machine()
    return None if machine in _AUDIT_ARCH else f"no syscall table for {machine}"


Sockets = Literal["any", "unix", "none"]
_programs: dict[tuple[Sockets, tuple[int, ...]], tuple[Any, Any]] = {}


def seccomp_filter(*, sockets: Sockets, protected_pids: tuple[int, ...] = ()) -> None:
    """Install a filter: EPERM for the denied syscalls; ``socket()`` refused for every
    family but AF_UNIX (``"unix"``) or for every family (``"none"``: a call without
    network reaches no socket at all, the daemon's included; ``socketpair`` still works);
    and no signal to, or pidfd of, ``protected_pids`` (nor ``kill(-1)``, which would reach
    them). Stacks under any filter already present (a container's). Needs no_new_privs."""
    fprog, _filters = seccomp_program(sockets=sockets, protected_pids=protected_pids)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0))


def seccomp_program(*, sockets: Sockets, protected_pids: tuple[int, ...] = ()) -> tuple[Any, Any]:
    """The BPF program, built once per process and arguments (the spawner warms the
    common ones before forking)."""
    key = (sockets, protected_pids)
    if key in _programs:
        return _programs[key]
    machine = platform.machine()
    nrs = sorted(_DENIED_SYSCALLS[machine].values())
    program: list[tuple[int, int, int, int]] = [
        (_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]),
        (_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),  # a foreign ABI (x32, i386) would dodge the numbers
        (_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        # x32 syscalls set bit 30 of nr; refuse them outright.
        program += [(0x45, 0, 1, 0x40000000), (_BPF_RET_K, 0, 0, _RET_ERRNO_EPERM)]  # jset
    for nr in nrs:
        program += [(_BPF_JEQ_K, 0, 1, nr), (_BPF_RET_K, 0, 0, _RET_ERRNO_EPERM)]
    if sockets == "none":
        program += [(_BPF_JEQ_K, 0, 1, _SOCKET_NR[machine]), (_BPF_RET_K, 0, 0, _RET_ERRNO_EPERM)]
    elif sockets == "unix":
        program += _argument_block(_SOCKET_NR[machine], [_AF_UNIX], refuse_others=True)
    if protected_pids:
        for name, nr in _TARGETED[machine].items():
            values = [pid & 0xFFFFFFFF for pid in protected_pids]
            if name == "kill":  # also the process group of each, and everyone (-1)
                values += [-pid & 0xFFFFFFFF for pid in protected_pids] + [0xFFFFFFFF]
            program += _argument_block(nr, sorted(set(values)), refuse_others=False)
    program.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    fprog = _SockFprog(len(program), filters)
    _programs[key] = (fprog, filters)  # filters: kept alive with the program
    return fprog, filters


def _argument_block(nr: int, values: list[int], *, refuse_others: bool) -> list[tuple[int, int, int, int]]:
    """For syscall ``nr``: compare the low 32 bits of its first argument with ``values``;
    a listed value is refused (or, with ``refuse_others``, the only ones allowed). The
    block returns for ``nr`` and falls through for any other syscall."""
    listed, unlisted = (_RET_ALLOW, _RET_ERRNO_EPERM) if refuse_others else (_RET_ERRNO_EPERM, _RET_ALLOW)
    body: list[tuple[int, int, int, int]] = [(_BPF_LD_W_ABS, 0, 0, 16)]  # seccomp_data.args[0], low half
    body += [(_BPF_JEQ_K, len(values) - i, 0, value) for i, value in enumerate(values)]
    body += [(_BPF_RET_K, 0, 0, unlisted), (_BPF_RET_K, 0, 0, listed)]
    return [(_BPF_JEQ_K, 0, len(body), nr), *body]
