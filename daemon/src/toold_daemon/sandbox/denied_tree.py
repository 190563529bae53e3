"""Finding the denied files below the roots, for the two places a name check is not enough.

Built-in tools refuse denied paths by name, and refuse a hard link to a denied file
(same inode, other name) by comparing inodes with the ones found here. Commands read
whatever the kernel lets them, so their zygote, in its own mount namespace, covers each denied file it finds
below the roots with ``/dev/null`` (and each denied directory with an empty read-only
tmpfs) before any command starts: ``cat .env``, ``grep -r``, ``cp``, a glob
or a symlink all meet the empty stand-in, and a hard link to it fails (``EXDEV``).

A file created after the zygote started is not covered by this layer (the lexical
check of command words still asks about it). The walk is bounded; past the bound the
layer reports itself partial.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .paths import Sandbox

_INODES_FRESH_S = 2.0
_inode_cache: dict[tuple[tuple[Path, ...], tuple[str, ...]], tuple[float, frozenset[tuple[int, int]]]] = {}


@dataclass(slots=True)
class Found:
    files: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    inodes: set[tuple[int, int]] = field(default_factory=set)  # (st_dev, st_ino) of ``files``
    complete: bool = True


def find_denied(sandbox: Sandbox, *, max_entries: int) -> Found:
    """Denied entries below the sandbox's roots (symlinks excluded: what they point to is
    checked where it lies, and outside the roots Landlock refuses it), visiting at most
    ``max_entries`` directory entries."""
    found = Found()
    if not sandbox.denied_patterns:
        return found
    budget = max_entries
    pending = [str(root) for root in sandbox.roots if os.path.isdir(root)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    budget -= 1
                    if budget < 0:
                        found.complete = False
                        return found
                    _consider(sandbox, entry, found, pending)
        except OSError:
            continue  # unreadable for this user: its commands cannot read it either
    return found


def _consider(sandbox: Sandbox, entry: os.DirEntry[str], found: Found, pending: list[str]) -> None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return
    mode = st.st_mode
    is_dir = stat.S_ISDIR(mode)
    if sandbox.denied_pattern(Path(entry.path)) is not None or (
        is_dir and sandbox.denied_pattern(Path(entry.path, "x")) is not None
    ):
        if is_dir:
            found.directories.append(entry.path)
        elif stat.S_ISREG(mode):
            found.files.append(entry.path)
            found.inodes.add((st.st_dev, st.st_ino))
        return
    if is_dir:
        pending.append(entry.path)


def denied_inodes(sandbox: Sandbox, *, max_entries: int = 1_000_000) -> frozenset[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every denied regular file below the roots, found again when
    older than a couple of seconds. Asked only for files with more than one link, so the
    walk is rare. A new hard link to a denied file has that file's inode, so it is caught
    whatever the cache's age; only a denied file created in the last seconds is missed."""
    key = (sandbox.roots, sandbox.denied_patterns)
    now = time.monotonic()
    cached = _inode_cache.get(key)
    if cached is not None and now - cached[0] < _INODES_FRESH_S:
        return cached[1]
    inodes = frozenset(find_denied(sandbox, max_entries=max_entries).inodes)
    if len(_inode_cache) > 32:
        _inode_cache.clear()
    _inode_cache[key] = (now, inodes)
    return inodes
