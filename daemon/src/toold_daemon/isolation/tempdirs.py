"""Private temp dirs for calls (each call's TMPDIR), reused when a call leaves its own as
it found it.

Every call gets a 0700 directory owned by the client's uid, under ``<base>/u<uid>``
(0700 too, so no other uid can even look). On a disk-backed /tmp, creating and removing
a directory costs ~0.1 ms each in journaled metadata, which shows in a ``shell true``.
A directory that is still empty, 0700 and owned by that uid once everything the call
started is dead is as good as a new one: it goes back to a small pool for that uid.
Anything else is removed.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile

from ..sandbox.trees import remove_tree

POOL_PER_UID = 16


class TempDirs:
    def __init__(self, daemon_euid: int, daemon_pid: int | None = None, *, cleanup_stale: bool = True) -> None:
        """``daemon_pid`` names the base (default: this process): the spawner keeps the
        temp dirs of its daemon, whose pid tells a later start whether they are stale."""
        self._euid = daemon_euid
        if cleanup_stale:
            remove_stale_bases(daemon_euid)
        self.base = tempfile.mkdtemp(prefix=f"toold-{daemon_euid}-p{daemon_pid or os.getpid()}-")
        os.chmod(self.base, 0o711)  # noqa: S103 - other uids may only traverse to their own dir
        self._pool: dict[int, list[str]] = {}

    def uid_base(self, uid: int, gid: int) -> str:
        """``<base>/u<uid>``, 0700 and owned by that uid: the one temp path its children may
        write besides the roots (one path per uid keeps the spawner's ruleset cache warm)."""
        base = os.path.join(self.base, f"u{uid}")
        if not os.path.isdir(base):
            os.mkdir(base, 0o700)
            if self._euid == 0:
                os.chown(base, uid, gid)
        return base

    def take(self, uid: int, gid: int) -> str:
        pool = self._pool.get(uid)
        if pool:
            return pool.pop()
        temp = tempfile.mkdtemp(prefix="call-", dir=self.uid_base(uid, gid))
        if self._euid == 0 and uid != 0:
            os.chown(temp, uid, gid)
        return temp

    def give_back(self, temp: str, uid: int, *, reusable: bool) -> None:
        """Pool ``temp`` if ``reusable`` (nothing the call started can still write) and
        untouched; else remove it."""
        pool = self._pool.setdefault(uid, [])
        if reusable and len(pool) < POOL_PER_UID and _untouched(temp, uid if self._euid == 0 else self._euid):
            pool.append(temp)
            return
        try:
            os.rmdir(temp)  # most calls leave it empty: a tenth of rmtree's cost
        except OSError:
            remove_tree(temp, ignore_errors=True)

    def close(self) -> None:
        self._pool.clear()
        remove_tree(self.base, ignore_errors=True)


def remove_stale_bases(euid: int) -> list[str]:
    """Remove the temp bases of daemons of this uid that are gone (killed with SIGKILL,
    so they could not clean up). A base names its daemon's pid; while any process has
    that pid the base is left alone (a reused pid only delays the cleanup)."""
    parent = tempfile.gettempdir()
    pattern = re.compile(rf"^toold-{euid}-p(\d+)-")
    removed = []
    for name in os.listdir(parent):
        match = pattern.match(name)
        if match is None or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        path = os.path.join(parent, name)
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == euid:
            remove_tree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _untouched(temp: str, owner: int) -> bool:
    try:
        info = os.lstat(temp)
        if not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) != 0o700 or info.st_uid != owner:
            return False
        with os.scandir(temp) as entries:
            return next(entries, None) is None
    except OSError:
        return False
