"""What ``toold doctor`` reports beside the isolation layers: how the daemon would run
as a service here (activation, notify and watchdog, its user and group, its socket,
its journal). Each line is a ``Check``; a required one that is off fails the doctor."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
from pathlib import Path

import msgspec

from ..config import Config
from ..egress.peers import open_diagnostics
from ..egress.rules import network_summary
from ..records.journal import JOURNAL_NAME, RECOVERY_NAME
from . import bytecode

SERVICE_GROUP = "toold"


class Check(msgspec.Struct, frozen=True):
    name: str
    on: bool
    detail: str
    required: bool = False


def service_checks(config: Config, endpoint: str, state_dir: Path, spawner_socket: str = "") -> list[Check]:
    return [
        _activation(),
        _notify(),
        _service_user(config),
        _spawner(spawner_socket),
        _service_group(),
        _socket(endpoint),
        _journal(state_dir),
        _bytecode(),
        _cgroup_moves(),
        *_network_modes(config),
        _proxy_connections(config),
    ]


def _bytecode() -> Check:
    """Whether the modules loaded so far (the daemon's, imported for the doctor) came from
    current bytecode. Run where Python may write it, importing them has just written it:
    ``PYTHONDONTWRITEBYTECODE=1 toold doctor`` sees what a read-only service sees."""
    loaded = bytecode.loaded_sources()
    missing = bytecode.stale(loaded)
    if not missing:
        return Check("bytecode", True, f"all {len(loaded)} modules loaded have current bytecode")
    return Check(
        "bytecode",
        False,
        f"{len(missing)} of {len(loaded)} modules loaded have no current bytecode (first: {missing[0]}): where "
        "Python cannot write it, every start compiles them again (python -m compileall, or scripts/bootstrap)",
    )


#: cgroup2's own mount options, which a remount must repeat to keep.
_CGROUP2_OPTIONS = (
    "nsdelegate",
    "memory_localevents",
    "memory_recursiveprot",
    "memory_hugetlb_accounting",
    "pids_localevents",
)


def _cgroup_moves() -> Check:
    try:
        mounts = Path("/proc/self/mounts").read_text()
        cmdline = Path("/proc/cmdline").read_text()
    except OSError as exc:
        return Check("cgroup moves", False, f"cannot tell: {exc.strerror}")
    return cgroup_moves(mounts, cmdline)


def cgroup_moves(mounts: str, cmdline: str) -> Check:
    """Whether a process moved into its call's cgroup waits for the kernel. Moving one takes
    a lock whose writer first waits out an RCU grace period unless another move came just
    before (5 to 17 ms measured, against 0.2-0.4 ms with the wait gone): every fresh
    worker, web_fetch child and the start-up probe pays it; a zygote is moved ahead of
    its commands, so they do not. ``favordynmods`` (a cgroup2 mount option, or the
    ``cgroup_favordynmods=`` boot option) trades it for slightly dearer forks and exits
    system-wide: the administrator's choice, so the daemon only says how."""
    cgroup2 = _cgroup2_mounts(mounts)
    if any(
        word.startswith("cgroup_favordynmods=") and word.split("=", 1)[1].lower() in ("1", "y", "true")
        for word in cmdline.split()
    ):
        return Check("cgroup moves", True, "without waiting (the kernel booted with cgroup_favordynmods)")
    if any("favordynmods" in fields[3].split(",") for fields in cgroup2):
        return Check("cgroup moves", True, "without waiting (cgroup2 is mounted with favordynmods)")
    if not cgroup2:
        return Check(
            "cgroup moves", False, "no cgroup2 mount: boot with cgroup_favordynmods=1 to move processes without waiting"
        )
    point, options = cgroup2[0][1], [o for o in cgroup2[0][3].split(",") if o in _CGROUP2_OPTIONS]
    remount = ",".join(["remount", *options, "favordynmods"])
    return Check(
        "cgroup moves",
        False,
        "a fresh worker, web_fetch child or start-up probe may wait 5-17 ms to enter its call's cgroup "
        f"(an RCU grace period); to remove the wait: mount -o {remount} none {point}",
    )


def _cgroup2_mounts(mounts: str) -> list[list[str]]:
    """The cgroup2 lines of a mount table (``/proc/self/mounts``), split into fields."""
    return [fields for fields in map(str.split, mounts.splitlines()) if len(fields) >= 4 and fields[2] == "cgroup2"]


def _command_tools(config: Config) -> list[str]:
    """The tools that run commands, each with its own network mode (``[tools.network]``)."""
    network = config.tools.network
    return sorted({"shell", "run_code", *network.tools, *(c.name for c in config.tools.commands)})


def _network_modes(config: Config) -> list[Check]:
    """How commands reach the network: "on" for the filtering proxy or none, "off" where a
    tool has the host's network unfiltered (``[tools.network]``)."""
    network = config.tools.network
    return [
        Check(f"network {tool}", network.mode_of(tool) != "host", network_summary(network, tool))
        for tool in _command_tools(config)
    ]


def _proxy_connections(config: Config) -> Check:
    network = config.tools.network
    diagnostics, why_not = open_diagnostics()
    if diagnostics is not None:
        diagnostics.close()
    try:
        cgroup2 = bool(_cgroup2_mounts(Path("/proc/self/mounts").read_text()))
    except OSError:
        cgroup2 = False
    return proxy_connections(
        any(network.mode_of(tool) == "proxy" for tool in _command_tools(config)),
        why_not,
        per_call_cgroup2=cgroup2 and config.tools.isolation.cgroups,
    )


def proxy_connections(proxied: bool, why_not_diagnostics: str, *, per_call_cgroup2: bool) -> Check:
    """Whether a command's proxy listener can tell its own command's connections from
    those of the other commands sharing its zygote's loopback: the kernel must report a
    socket's cgroup (``egress.peers``), and calls need cgroups in the unified hierarchy."""
    if not proxied:
        return Check("proxy connections", True, "no command goes through the egress proxy")
    if why_not_diagnostics:
        return Check(
            "proxy connections",
            False,
            f"any command of a zygote can use another's proxy listener: {why_not_diagnostics}",
        )
    if not per_call_cgroup2:
        return Check(
            "proxy connections",
            False,
            "any command of a zygote can use another's proxy listener: no per-call cgroups in cgroup2",
        )
    return Check(
        "proxy connections", True, "a command's proxy listener serves only connections made in its call's cgroup"
    )


def _activation() -> Check:
    if os.environ.get("LISTEN_FDS") and os.environ.get("LISTEN_PID") == str(os.getpid()):
        return Check("socket activation", True, f"systemd passes {os.environ['LISTEN_FDS']} socket(s)")
    return Check("socket activation", False, "not activated: toold binds its own socket")


def _notify() -> Check:
    target = os.environ.get("NOTIFY_SOCKET", "")
    if not target:
        return Check("notify", False, "no NOTIFY_SOCKET: not started by systemd as Type=notify")
    watchdog = os.environ.get("WATCHDOG_USEC", "")
    pings = f"watchdog every {int(watchdog) / 2e6:g}s" if watchdog.isdigit() else "no watchdog"
    return Check("notify", True, f"READY/STATUS/STOPPING to {target}; {pings}")


def _service_user(config: Config) -> Check:
    name = config.daemon.user
    if not name:
        return Check("service user", False, f"none: the protocol process stays uid {os.getuid()} ([daemon] user)")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return Check("service user", False, f"[daemon] user = {name!r} does not exist", required=True)
    return Check("service user", True, f"{name} (uid {entry.pw_uid}): the protocol process drops to it")


def _spawner(path: str) -> Check:
    """Where the spawner runs: forked by ``serve``, or on its own behind ``path``."""
    if not path:
        return Check("spawner", True, "forked by toold serve (one process tree holds both halves)")
    try:
        st = os.lstat(path)
    except OSError:
        return Check("spawner", False, f"no spawner socket at {path} (toold-spawner not running)", required=True)
    if not stat.S_ISSOCK(st.st_mode):
        return Check("spawner", False, f"{path} is not a socket", required=True)
    owner = _name(pwd.getpwuid, st.st_uid)
    return Check("spawner", True, f"of its own at {path} (for {owner}, {stat.S_IMODE(st.st_mode):04o})")


def _service_group() -> Check:
    try:
        group = grp.getgrnam(SERVICE_GROUP)
    except KeyError:
        return Check("service group", False, f"no group {SERVICE_GROUP!r} (the packaged socket admits its members)")
    members = ", ".join(group.gr_mem) or "no members listed"
    return Check("service group", True, f"{SERVICE_GROUP} (gid {group.gr_gid}): {members}")


def _socket(endpoint: str) -> Check:
    if not endpoint.startswith("ipc://"):
        return Check("socket", False, f"{endpoint}: not a Unix socket")
    path = endpoint.removeprefix("ipc://")
    try:
        st = os.stat(path)
    except OSError:
        return Check("socket", False, f"no socket at {path} (daemon not running)")
    if not stat.S_ISSOCK(st.st_mode):
        return Check("socket", False, f"{path} is not a socket", required=True)
    owner = _name(pwd.getpwuid, st.st_uid)
    group = _name(grp.getgrgid, st.st_gid)
    return Check("socket", True, f"{path} {owner}:{group} {stat.S_IMODE(st.st_mode):04o}")


def _journal(state_dir: Path) -> Check:
    path = state_dir / JOURNAL_NAME
    try:
        size = sum(p.stat().st_size for p in state_dir.glob(JOURNAL_NAME + "*"))
    except OSError as exc:
        return Check("journal", False, f"{path}: {exc.strerror}")
    if not path.exists():
        return Check("journal", False, f"none yet at {path}")
    return Check("journal", True, f"{path}: {size / 1e6:.1f} MB with its WAL; {_last_recovery(state_dir)}")


def _last_recovery(state_dir: Path) -> str:
    try:
        note = json.loads((state_dir / RECOVERY_NAME).read_text())
        return (
            f"last start {note['at']}: {note['interrupted_calls']} call(s) marked interrupted, "
            f"{note['waiting_batches']} batch(es) waiting for resume or discard"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "no recovery noted yet"


def _name(lookup: object, number: int) -> str:
    try:
        return str(lookup(number)[0])  # type: ignore[operator]
    except KeyError:
        return str(number)
