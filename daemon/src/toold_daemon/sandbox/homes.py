"""Where home directories are, for the protected locations that hold wherever a workspace lies.

Programs read their configuration from the dotfiles and dot-directories directly in a
home (``~/.gitconfig``, ``~/.bash_aliases``, ``~/.config/systemd/user/``,
``~/.local/bin/``, ``~/.local/lib/python3.*/site-packages/*.pth`` …), and many of them
run commands named there. A workspace that is, or contains, a home would let a tool plant
such a file for the user's next ``git status`` or login, outside every sandbox. So every
entry whose name starts with a dot directly in a home, and everything below it, is
protected, whatever the configured patterns say.

A home is any account's home directory (the password database, so NSS accounts count),
every directory directly in ``/home``, and ``/root``; ``/`` and homes that do not exist
are left out.
"""

from __future__ import annotations

import os
import pwd
import time

from ..config import HOME_DOTFILES
from .lookups import refuse_to_wait

_FRESH_SECONDS = 60.0
_cache: dict[str, tuple[float, frozenset[str]]] = {}


def home_directories() -> frozenset[str]:
    """Canonical paths of every home directory on this host, read again once a minute."""
    now = time.monotonic()
    cached = _cache.get("homes")
    if cached is not None and now - cached[0] < _FRESH_SECONDS:
        return cached[1]
    refuse_to_wait()  # the user database and the homes (NFS, LDAP) may not answer: not on the loop
    candidates = {"/root"}
    try:
        candidates.update(entry.pw_dir for entry in pwd.getpwall())
    except OSError:
        pass
    try:
        with os.scandir("/home") as entries:
            candidates.update(entry.path for entry in entries if entry.is_dir(follow_symlinks=False))
    except OSError:
        pass
    canonical = (os.path.realpath(c) for c in candidates if c.startswith("/"))
    homes = frozenset(real for real in canonical if real != "/" and os.path.isdir(real))
    _cache["homes"] = (now, homes)
    return homes


def home_dotfile(path: str, homes: frozenset[str]) -> str | None:
    """The home whose dot-entry canonical ``path`` is (or lies in), if any."""
    for home in homes:
        if path.startswith(home) and path[len(home) : len(home) + 2] == "/.":
            return home
    return None


def homes_within(roots: list[str], homes: frozenset[str]) -> list[str]:
    """The homes that are one of ``roots`` or lie below one, outermost first."""
    inside = {home for home in homes for root in roots if home == root or home.startswith(root.rstrip("/") + "/")}
    return sorted(inside, key=lambda home: (home.count("/"), home))


__all__ = ["HOME_DOTFILES", "home_directories", "home_dotfile", "homes_within"]
