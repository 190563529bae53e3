"""The protocol process gives up root: ``[daemon] user``.

Called once the spawner runs (it keeps root, and checks every request on its own), the
socket is bound and the journal is open. What the process still needs afterwards it is
handed first: the state and runtime directories become the user's, and so do the
delegation files of its cgroup base (as systemd's ``Delegate=yes`` does), so it can
still create, limit, kill and remove call cgroups and move a zygote between them. Then:
an empty bounding set, ``setgroups([])``, ``setresgid``, ``setresuid`` (real, effective
and saved), no capabilities, ``no_new_privs``, not dumpable, and where the kernel has
Landlock a ruleset of its own: read anything its uid may read, write only its
directories and cgroups.

Killing a command of another user needs ``cgroup.kill`` (cgroup v2): an unprivileged
process cannot signal it. Without it the daemon refuses to drop rather than run
commands it could not stop.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Sequence
from pathlib import Path

from ..isolation import kernel
from ..isolation.cgroup import Cgroups

# What a delegated cgroup subtree's owner must own (besides the directory), as systemd does.
_DELEGATED_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")


class CannotDrop(Exception):
    """The drop cannot be made safely (the message says why); the daemon stops."""


def drop_to(user: str, *, own: Sequence[Path], cgroups: Cgroups, others: bool = True) -> dict[str, str]:
    """Become ``user`` for good; returns what was done, layer by layer (for the log).
    ``own``: files (the socket, its lock, the journal and its companions) and private
    directories (the state and runtime directories) the user must keep writing; a
    directory others may write to (``/tmp``) is never given away, only the files named.
    ``others``: tools may run for other uids (a root spawner), so their commands can be
    stopped only through cgroup.kill."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise CannotDrop(f"[daemon] user {user!r} does not exist") from None
    uid, gid = entry.pw_uid, entry.pw_gid
    if os.geteuid() != 0 and os.geteuid() != uid:
        raise CannotDrop(f"only root can become {user!r} (running as uid {os.geteuid()})")
    if uid == 0:
        raise CannotDrop("[daemon] user must not be root")
    if os.geteuid() == uid and not others:
        return _confine_as_started(user, own, cgroups)
    if not any(h.version == 2 for h in cgroups.hierarchies):
        raise CannotDrop(
            "an unprivileged daemon kills other users' commands through cgroup.kill, which needs "
            f"cgroup v2 here: {cgroups.describe()}"
        )
    if os.geteuid() == uid:
        return _confine_as_started(user, own, cgroups)
    for path in own:
        _give(path, uid, gid)
    cgroups.keep_unified_only()
    for hierarchy in cgroups.hierarchies:
        base = Path(hierarchy.base)
        for path in (base, *(base / name for name in _DELEGATED_FILES)):
            _give(path, uid, gid)
    report = {"capabilities": _empty_bounding_set()}
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise CannotDrop("setresuid/setresgid did not take")
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    report["privilege"] = f"on (uid {uid}, gid {gid}: {user})"
    report["landlock"] = _confine_writes([*map(str, own), *(h.base for h in cgroups.hierarchies)])
    return report


def _confine_as_started(user: str, own: Sequence[Path], cgroups: Cgroups) -> dict[str, str]:
    """Started as ``user`` already (a unit with ``User=``, next to a spawner of its own):
    nothing to give up but what an exec could regain and what Landlock can fence."""
    cgroups.keep_unified_only()
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    return {
        "privilege": f"on (started as {user}, uid {os.geteuid()})",
        "landlock": _confine_writes([*map(str, own), *(h.base for h in cgroups.hierarchies)]),
    }


def _give(path: Path, uid: int, gid: int) -> None:
    """Make ``path`` ``uid``'s: a file or cgroup entry of ours, or a directory that is ours
    alone (owned by us, writable by nobody else; a shared one like /tmp is left as it
    is); never through a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise CannotDrop(f"{path} is a symlink; refusing to give it away")
    if stat.S_ISDIR(st.st_mode) and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
        return
    os.chown(path, uid, gid, follow_symlinks=False)


def _empty_bounding_set() -> str:
    """Nothing this process could ever execute regains a capability."""
    try:
        kernel.prctl(kernel.PR_CAP_AMBIENT, kernel.PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(kernel.last_capability() + 1):
            kernel.prctl(kernel.PR_CAPBSET_DROP, cap)
    except OSError as exc:
        return f"partial: the bounding set could not be emptied ({exc.strerror})"
    return "on (none; bounding set empty)"


def _confine_writes(writable: list[str]) -> str:
    """Landlock: read and execute what the uid may; create, change or remove files only
    in ``writable`` (and write /dev/null)."""
    abi = kernel.landlock_abi()
    if abi == 0:
        return "off: the kernel has no Landlock"
    everything = kernel.fs_access_for_abi(abi) & ~(kernel.FS_MAKE_CHAR | kernel.FS_MAKE_BLOCK | kernel.FS_IOCTL_DEV)
    rules = [("/", kernel.READ_EXEC), *((path, everything) for path in writable)]
    rules.append(("/dev/null", kernel.READ | kernel.FS_WRITE_FILE))
    try:
        ruleset = kernel.landlock_ruleset(rules, abi)
        try:
            kernel.landlock_restrict_self(ruleset)
        finally:
            os.close(ruleset)
    except OSError as exc:
        return f"off: Landlock refused ({exc.strerror})"
    return f"on (ABI {abi}; writes only to {', '.join(writable)})"
