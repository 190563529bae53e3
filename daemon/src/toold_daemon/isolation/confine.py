"""What a freshly forked child does to itself before running anything, in order.

setsid → parent-death signal → fds → stdin /dev/null → signals → identity → network
namespace → no_new_privs → rlimits → Landlock → seccomp. The network namespace comes
before Landlock because mapping uids in a new user namespace writes to /proc, which
Landlock would then forbid. Each step that the kernel refuses is recorded in the
returned layer report; a step named in ``require`` that fails aborts the child.
The mount views commands see over their roots are built in ``views``.
"""

from __future__ import annotations

import os
import pwd
import resource
import signal
import socket
import sys
import time
from collections.abc import Sequence

from ..config.capabilities import capability_number
from ..egress.peers import open_diagnostics
from ..egress.process import EgressPeers
from ..egress.rules import EgressRules
from . import cgroup, kernel
from .views import mount_views, processes_report
from .wire import Limits, SpawnRequest, frame


class ConfinementFailed(Exception):
    """A required layer could not be applied; the child must not run the tool."""


SYSTEM_READ_EXEC = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/nix/store")
SYSTEM_READ = ("/etc", "/proc", "/sys/devices/system/cpu", "/run/systemd/resolve")
# What a snippet (``run_code``) may read of /etc: the dynamic linker's cache, time zones,
# certificates, name resolution, MIME types and the interpreters' own configuration; not
# the accounts, the host's name or anything else about the machine.
SNIPPET_READ = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/ssl", "/etc/ca-certificates",
    "/etc/pki", "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
    "/etc/mime.types", "/etc/inputrc", "/etc/alternatives",
)  # fmt: skip


def snippet_reads() -> list[str]:
    """``SNIPPET_READ`` and the interpreters' configuration directories (``/etc/python3.11``)."""
    import glob

    return [*SNIPPET_READ, *glob.glob("/etc/python3*"), *glob.glob("/etc/perl")]


DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/pts", "/dev/ptmx", "/dev/shm")
# Not /dev/stdin and friends: they resolve to the *spawner's* streams when the rule is made.
DEVICES_READ = ("/dev/urandom", "/dev/random")


def confine(
    request: SpawnRequest,
    keep_fds: list[int],
    parent_pid: int,
    landlock: int | str,
    *,
    protected: tuple[int, ...] = (),
    groups: list[int] | None = None,
) -> dict[str, str]:
    """Apply every layer to this process; return ``{layer: "on" | reason it is off}``.
    ``landlock`` is a ruleset fd the spawner built (``landlock_ruleset``) or why there is none;
    ``groups``: the client's, as the spawner looked them up (``supplementary_groups``).
    Nothing this process starts may signal ``protected`` (the spawner, the daemon), its
    parent or itself."""
    layers: dict[str, str] = {}
    joined = cgroup.join(request.cgroups)  # first: everything the call starts is inside it
    layers["cgroup"] = "on" if joined else "off: no per-call cgroup for this call"
    os.setsid()
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the spawner died before the signal was armed
        os._exit(70)
    _close_other_fds([*keep_fds, landlock] if isinstance(landlock, int) else keep_fds)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # The defaults a program expects (a server exec'd below; Python ignores SIGPIPE and
    # SIGXFSZ). The Python that stays (zygote, worker, supervisor) ignores SIGPIPE again.
    defaults = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)
    for signum in (*defaults, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    layers["capabilities"] = _drop_capabilities(request.keep_capabilities)
    readonly = [p for p in request.readonly_paths if os.path.lexists(p)]
    views = bool(readonly or request.hidden_patterns or request.protected_patterns or request.protect_homes)
    as_root = os.geteuid() == 0
    if views and as_root:  # while we may still mount without a user namespace
        layers.update(mount_views(request, readonly, new_user_namespace=False))
    layers["processes"] = processes_report(request.uid)
    layers["privilege"] = _drop_identity(request.uid, request.gid, request.drop_groups, groups)
    guarded = guarded_pids(parent_pid, protected, zygote=request.zygote)
    proxied = request.egress_proxy and not request.network
    # A zygote makes the link to the runner and hands it over; a stdio server or a command
    # started on its own got it as its last fd (after the channel, and a server's stderr).
    own_fds = 2 if request.stdio else 1
    runner_fd = keep_fds[own_fds] if not request.zygote and len(keep_fds) > own_fds else None
    if proxied and not request.zygote and runner_fd is None:
        proxied = False  # no link to judge connections by: no network
    links = _start_egress(request, landlock, guarded, runner_fd) if proxied else None  # before the network is cut
    namespace = _cut_network(request) if not request.network else ""
    if links is not None:
        layers["egress"] = _open_loopback(namespace, links)
    # Never a user namespace of our own for a process that is uid 0 in it: it would hold
    # every capability there again. A root daemon mounted above, once.
    if views and not as_root:
        in_own_user_namespace = namespace.startswith("on") and os.getuid() != 0
        layers.update(mount_views(request, readonly, new_user_namespace=not in_own_user_namespace))
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    layers["no_new_privs"] = "on"
    _set_limits(request.limits)
    layers["rlimits"] = "on"
    layers["landlock"] = _apply_landlock(landlock)
    layers["seccomp"] = _seccomp(request, guarded, sockets=request.network or bool(_egress))
    layers["signals"] = signals_report(layers["landlock"], layers["seccomp"])
    layers["network"] = network_report(
        allowed=request.network,
        namespace=namespace,
        seccomp=layers["seccomp"],
        landlock_tcp=layers["landlock"].startswith("on") and landlock_cuts_tcp(request.network),
    )
    for name in request.require:
        if not layers.get(name, "off").startswith("on"):
            raise ConfinementFailed(f"required isolation layer {name!r} is off: {layers.get(name, 'unknown layer')}")
    return layers


#: A proxy-mode zygote's links to its egress process: (to the process, the runner's end).
_egress: list[tuple[socket.socket, socket.socket | None]] = []
_egress_pid: list[int] = []


def egress_links() -> tuple[socket.socket, socket.socket | None] | None:
    """The zygote's link to its egress process and the end it hands to the runner."""
    return _egress[0] if _egress else None


def wait_for_egress(seconds: float) -> None:
    """Before a process whose command is over exits (its egress process dies with it),
    let the egress process finish: it ends once every call it served has been
    forgotten by the runner, which first receives the records of their connections.
    At most ``seconds``; the runner's kill ends both anyway."""
    if not _egress_pid:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.waitpid(_egress_pid[0], os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.005)


def _start_egress(
    request: SpawnRequest, landlock: int | str, guarded: tuple[int, ...], runner_fd: int | None
) -> tuple[socket.socket, socket.socket | None]:
    """Fork the egress process while this one still has the host's network: it confines
    itself as the commands will be (same uid, no_new_privs, rlimits, the same Landlock
    rules, seccomp allowing sockets), then serves the proxy (``egress.process``). Its link
    to the runner is ``runner_fd`` when given (a stdio server's), else a new pair whose
    other end the zygote hands over."""
    to_egress, egress_zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if runner_fd is None:
        runner_end, egress_runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        runner_end, egress_runner_end = None, socket.socket(fileno=os.dup(runner_fd))
        os.close(runner_fd)
    pid = os.fork()
    if pid == 0:  # the egress process
        try:
            kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
            to_egress.close()
            if runner_end is not None:
                runner_end.close()
            keep = [egress_zygote_end.fileno(), egress_runner_end.fileno()]
            _close_other_fds([*keep, landlock] if isinstance(landlock, int) else keep)  # the zygote's channel too
            kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
            _set_limits(request.limits)
            confined = _apply_landlock(landlock)
            if not confined.startswith("on") and "landlock" in request.require:
                os._exit(71)
            if kernel.seccomp_supported() is None:
                kernel.seccomp_filter(sockets="any", protected_pids=guarded)
            from ..egress.process import serve

            serve(egress_zygote_end, egress_runner_end, _egress_rules(request))
        finally:
            os._exit(0)
    _egress_pid.append(pid)
    egress_zygote_end.close()
    egress_runner_end.close()
    return to_egress, runner_end


def _egress_rules(request: SpawnRequest) -> EgressRules:
    """The administrator's network rules, from the configuration the request carries."""
    import msgspec

    from ..config import Config

    try:
        config = msgspec.msgpack.decode(request.config, type=Config) if request.config else Config()
    except msgspec.DecodeError:
        config = Config()
    network = config.tools.network
    return EgressRules.of(
        allowed_domains=network.allowed_domains,
        denied_domains=network.denied_domains,
        allowed_ports=network.allowed_ports,
        allowed_networks=network.allowed_networks,
    )


def _open_loopback(namespace: str, links: tuple[socket.socket, socket.socket | None]) -> str:
    """Bring up the loopback of the new network namespace, where the proxy listens. Without
    a namespace of its own there is no proxy: the network stays cut."""
    if not namespace.startswith("on"):
        for link in links:
            if link is not None:
                link.close()
        return f"off: no network namespace for the proxy ({namespace}); the network is cut"
    try:
        kernel.loopback_up()
    except OSError as exc:
        for link in links:
            if link is not None:
                link.close()
        return f"off: the namespace's loopback could not be brought up ({exc.strerror}); the network is cut"
    _egress.append((links[0], links[1]))
    return f"on (a filtering proxy is the only way out; {_tell_egress_the_peers(links[0])})"


def _tell_egress_the_peers(to_egress: socket.socket) -> str:
    """Give the egress process this namespace's socket diagnostics, by which it serves a
    command's listener only for connections that command's cgroup made: all commands of
    a zygote share its loopback (``egress.peers``). What the layer report says of it."""
    diagnostics, why_not = open_diagnostics()
    if diagnostics is None:
        return f"a command's listener takes connections from any command of its zygote: {why_not}"
    try:
        socket.send_fds(to_egress, [frame(EgressPeers())], [diagnostics.fileno()])
    except OSError as exc:
        return f"a command's listener takes connections from any command of its zygote ({exc.strerror or exc})"
    finally:
        diagnostics.close()
    return "a connection to a command's listener is served only if made in that call's cgroup"


def _close_other_fds(keep: list[int]) -> None:
    try:
        open_fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(3, 1024))
    for fd in open_fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _drop_capabilities(keep: list[str]) -> str:
    """Empty the bounding and ambient sets (but ``keep``), so that nothing this process
    executes holds a capability, even as root. Needs CAP_SETPCAP: a daemon that is not
    root has no capabilities to lose."""
    if os.geteuid() != 0:
        return "on (the daemon holds no capabilities)"
    kept = {capability_number(name) for name in keep}
    try:
        kernel.prctl(kernel.PR_CAP_AMBIENT, kernel.PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(kernel.last_capability() + 1):
            if cap not in kept:
                kernel.prctl(kernel.PR_CAPBSET_DROP, cap)
        kernel.clear_inheritable(kept)
    except OSError as exc:
        return f"off: the bounding set could not be emptied ({exc.strerror})"
    return "on" + (f" (kept {', '.join(sorted(keep))})" if keep else "")


def supplementary_groups(uid: int, gid: int) -> list[int] | None:
    """The groups a child acting as ``uid`` takes: ``gid`` and the user's others. The
    spawner looks them up before it forks: in a child, the C library loads its name
    service modules afresh every time (0.5-1.2 ms measured, against 0.15 ms in the
    spawner). None where no child changes identity (not root, or a root client)."""
    if os.geteuid() != 0 or uid <= 0:
        return None
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


def _drop_identity(uid: int, gid: int, drop_groups: Sequence[int] = (), groups: list[int] | None = None) -> str:
    """Become the requesting peer. As root: setgroups, setgid, setuid. As anyone else the
    spawner only serves its own uid (the runner refuses others before asking). The
    client's supplementary groups (``groups``, else looked up here) are kept but for
    ``drop_groups`` (the service's own group, which would reach the daemon's socket and
    state), unless it is their primary."""
    if uid < 0 or (os.geteuid() != 0 and uid == os.geteuid()):
        return "on (same uid as the daemon)"
    if os.geteuid() != 0:
        raise ConfinementFailed(f"daemon uid {os.geteuid()} cannot act as uid {uid}")
    if uid == 0:
        return "on (client is root)"
    if groups is None:
        groups = supplementary_groups(uid, gid) or [gid]
    os.setgroups([g for g in groups if g == gid or g not in drop_groups])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise ConfinementFailed("setuid did not take")
    return "on"


def _cut_network(request: SpawnRequest) -> str:
    """A new network namespace holds only a downed loopback. Unprivileged, it needs a new
    user namespace too, mapped to the same uid so files keep their owner."""
    if not request.network_namespace:
        return "off: network namespaces disabled by configuration"
    try:
        if os.getuid() == 0:
            kernel.unshare(kernel.CLONE_NEWNET)
        else:
            kernel.unshare_as_same_uid(kernel.CLONE_NEWNET)
        return "on (cut off: new network namespace)"
    except OSError as exc:
        return f"off: network namespace refused ({exc.strerror})"


def guarded_pids(spawner_pid: int, protected: tuple[int, ...], *, zygote: bool) -> tuple[int, ...]:
    """The pids no tool process may signal: the spawner, the daemon, and a zygote itself
    (it holds other calls' channels). A one-call child need not guard itself, which keeps
    its filter the one the spawner built in advance."""
    return tuple(sorted({spawner_pid, *protected, *([os.getpid()] if zygote else [])}))


def network_report(*, allowed: bool, namespace: str, seccomp: str, landlock_tcp: bool) -> str:
    """Which layer cut the network, best first: a network namespace (nothing reachable),
    seccomp (no socket but AF_UNIX), Landlock (TCP only: UDP still leaves). Never silent."""
    if allowed:
        return "on (network allowed for this call)"
    if namespace.startswith("on"):
        return namespace
    if seccomp == "on":
        return "on (cut off: seccomp refuses every socket, AF_UNIX included)"
    if landlock_tcp:
        return "on (partial: Landlock forbids TCP bind/connect; UDP is not cut)"
    return f"{namespace}; seccomp {seccomp}; Landlock TCP rules unavailable"


def landlock_cuts_tcp(network_allowed: bool) -> bool:
    """Rulesets for calls without network also forbid TCP where Landlock can (ABI 4): the
    last fallback, and harmless behind a network namespace or the seccomp filter."""
    return not network_allowed and kernel.landlock_denies_tcp(kernel.landlock_abi())


def _set_limits(limits: Limits) -> None:
    wanted = {
        resource.RLIMIT_CPU: limits.cpu_seconds,
        resource.RLIMIT_AS: limits.address_space_bytes,
        resource.RLIMIT_FSIZE: limits.file_size_bytes,
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_NPROC: limits.processes,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in wanted.items():
        _soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))


def landlock_ruleset(
    roots: list[str],
    writable: list[str],
    *,
    network: bool,
    tools_only: bool = False,
    readable: Sequence[str] = (),
    narrow: bool = False,
) -> int | str:
    """Build the ruleset for these roots (in the spawner, cached): a fd, or why not.
    ``tools_only``: the narrower set of a tool worker (``tool_worker_rules``);
    ``readable``: more read+execute places (an MCP server's install directory);
    ``narrow``: of /etc only ``SNIPPET_READ`` (``run_code``)."""
    abi = kernel.landlock_abi()
    if abi == 0:
        return "off: the kernel has no Landlock (needs Linux 5.13 with landlock in the LSM list)"
    try:
        rules = tool_worker_rules(roots, abi) if tools_only else landlock_rules(roots, writable, abi, narrow=narrow)
        rules += [(path, kernel.READ_EXEC) for path in readable if os.path.exists(path)]
        return kernel.landlock_ruleset(rules, abi, deny_tcp=landlock_cuts_tcp(network))
    except OSError as exc:
        return f"off: Landlock refused the ruleset ({exc.strerror})"


def _apply_landlock(ruleset: int | str) -> str:
    if isinstance(ruleset, str):
        return ruleset
    try:
        kernel.landlock_restrict_self(ruleset)
    except OSError as exc:
        return f"off: Landlock refused ({exc.strerror})"
    finally:
        os.close(ruleset)
    return f"on (ABI {kernel.landlock_abi()})"


def landlock_rules(roots: list[str], writable: list[str], abi: int, *, narrow: bool = False) -> list[tuple[str, int]]:
    """Read-write on the roots and the private temp dirs; read+execute on system
    directories and the interpreter; read on /etc (``narrow``: only what programs need of
    it) and /proc; the usual devices."""
    rw = _read_write(abi)
    rules: list[tuple[str, int]] = [(root, rw) for root in [*roots, *writable]]
    rules += [(p, kernel.READ_EXEC) for p in (*SYSTEM_READ_EXEC, *_interpreter_paths())]
    system = [p for p in SYSTEM_READ if p != "/etc"] + snippet_reads() if narrow else list(SYSTEM_READ)
    rules += [(p, kernel.READ) for p in system]
    rules += [(p, kernel.READ | kernel.FS_WRITE_FILE | kernel.FS_TRUNCATE) for p in DEVICES_RW]
    rules += [(p, kernel.READ) for p in DEVICES_READ]
    return rules


def tool_worker_rules(roots: list[str], abi: int) -> list[tuple[str, int]]:
    """A tool worker reaches its roots (read-write), the system's programs and libraries
    and the interpreter (for a lazy import, or ripgrep), nothing else: not /etc, not
    /proc, not /tmp, not home directories. A read that the userspace checks would let out
    of the roots is still refused by the kernel."""
    rules: list[tuple[str, int]] = [(root, _read_write(abi)) for root in roots]
    rules += [(p, kernel.READ_EXEC) for p in (*SYSTEM_READ_EXEC, *_interpreter_paths())]
    rules += [(p, kernel.READ | kernel.FS_WRITE_FILE) for p in ("/dev/null",)]
    rules += [(p, kernel.READ) for p in DEVICES_READ]
    return rules


def _read_write(abi: int) -> int:
    return kernel.fs_access_for_abi(abi) & ~(kernel.FS_MAKE_CHAR | kernel.FS_MAKE_BLOCK | kernel.FS_IOCTL_DEV)


def _interpreter_paths() -> list[str]:
    """The interpreter's prefixes and the directories our packages are imported from."""
    import toold_protocol

    daemon_package = os.path.dirname(os.path.dirname(__file__))
    protocol_package = os.path.dirname(toold_protocol.__file__ or daemon_package)
    return sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, daemon_package, protocol_package})


def _seccomp(request: SpawnRequest, protected: tuple[int, ...], *, sockets: bool) -> str:
    why_not = kernel.seccomp_supported()
    if why_not is not None:
        return f"off: {why_not}"
    try:
        kernel.seccomp_filter(sockets="any" if sockets else "none", protected_pids=protected)
    except OSError as exc:
        return f"off: seccomp refused ({exc.strerror})"
    return "on"


def signals_report(landlock: str, seccomp: str) -> str:
    """Which layer keeps a tool from signalling the daemon, the spawner and its zygote."""
    scoped = landlock.startswith("on") and kernel.landlock_scopes(kernel.landlock_abi())
    if scoped and seccomp == "on":
        return "on (Landlock signal scope, and seccomp for the zygote)"
    if seccomp == "on":
        return "on (partial: seccomp guards the pids of the daemon, spawner and zygote, not the daemon's threads)"
    if scoped:
        return "on (partial: Landlock signal scope; a command may signal its own zygote)"
    return "off: neither Landlock signal scoping (Linux 6.12) nor seccomp"
