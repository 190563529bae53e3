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
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import msgspec

from . import long_paths


class Patterns(Protocol):
    """What the walk needs of a sandbox: its roots and how its patterns judge a path
    (``paths.Sandbox`` is one; the walk does not depend on it, it is used by it)."""

    roots: tuple[Path, ...]
    denied_patterns: tuple[str, ...]
    protected_patterns: tuple[str, ...]

    def may_be_denied(self, name: str) -> bool: ...

    def may_be_protected(self, name: str) -> bool: ...

    def name_screen(self, *, protected: bool) -> Callable[[str], object] | None: ...

    def denied_pattern(self, path: Path | str) -> str | None: ...

    def protected_pattern(self, path: Path | str) -> str | None: ...


_INODES_FRESH_S = 2.0
#: A name no file can have: a directory whose every entry a pattern matches (``.ssh/**``)
#: matches with this appended, and is then covered whole, new entries included.
EVERYTHING_BELOW = "/\0"
_inode_cache: dict[tuple[tuple[Path, ...], tuple[str, ...]], tuple[float, frozenset[tuple[int, int]]]] = {}


class Found(msgspec.Struct):
    files: list[str] = msgspec.field(default_factory=list)  # to cover: denied files, and other names of them
    directories: list[str] = msgspec.field(default_factory=list)  # to cover: denied directories
    inodes: set[tuple[int, int]] = msgspec.field(default_factory=set)  # (st_dev, st_ino) of every denied file
    complete: bool = True
    #: Every other regular file by inode number (from the directory, no stat): where other
    #: names of a denied file may be; checked with a stat only for a denied file's number.
    #: The first path of each number, then (rare: hard links, other devices) the others;
    #: a list per file cost the walk a fifth of its time.
    by_inode: dict[int, str] = msgspec.field(default_factory=dict)
    more_by_inode: dict[int, list[str]] = msgspec.field(default_factory=dict)
    #: With ``protected``: the outermost files and directories matching a protected pattern.
    protected: list[str] = msgspec.field(default_factory=list)
    #: Directories that may be passed through but not listed: what is in them is not known.
    unlisted: list[str] = msgspec.field(default_factory=list)

    def note_file(self, inode: int, path: str) -> None:
        """A regular file with inode number ``inode``, where another name of a denied file may be."""
        if self.by_inode.setdefault(inode, path) is not path:
            self.more_by_inode.setdefault(inode, []).append(path)

    def files_numbered(self, inode: int) -> list[str]:
        """Every file noted with inode number ``inode``."""
        first = self.by_inode.get(inode)
        return [] if first is None else [first, *self.more_by_inode.get(inode, ())]


def find_denied(sandbox: Patterns, *, max_entries: int, protected: bool = False) -> Found:
    """Denied entries below the sandbox's roots, visiting at most ``max_entries`` directory
    entries. Files inside a denied directory count as denied (their inodes are kept), and
    a hard link to a denied file under an innocent name is covered too. Symlinks are
    left alone: what they point to is checked where it lies, and outside the roots
    Landlock refuses it. With ``protected``, the same walk also finds the entries that
    match the sandbox's protected patterns (for commands to see read-only)."""
    found = Found()
    if not sandbox.denied_patterns and not (protected and sandbox.protected_patterns):
        return found
    budget = max_entries
    may_be_denied, may_be_protected = sandbox.may_be_denied, sandbox.may_be_protected  # bound once
    # A name neither kind of pattern can match needs no closer look (most names): in a
    # directory outside denied ones, such a file is only noted by inode, such a directory
    # walked. (With protected entries looked for, inside a protected directory the screen
    # still asks about protected names: a closer look then finds nothing more.)
    screen = sandbox.name_screen(protected=protected) or (lambda name: True)
    note_file = found.note_file
    # (directory, inside a denied one, inside a protected one (or not looking))
    pending = [(str(root), False, not protected) for root in sandbox.roots if os.path.isdir(root)]
    while pending:
        directory, inside_denied, inside_protected = pending.pop()
        try:
            with _entries_of(directory) as entries:
                for entry in entries:
                    budget -= 1
                    if budget < 0:
                        found.complete = False
                        return _with_other_names(found)
                    if not inside_denied and not screen(entry.name):
                        try:
                            if entry.is_file(follow_symlinks=False):
                                note_file(entry.inode(), entry.path)
                            elif entry.is_dir(follow_symlinks=False):
                                pending.append((entry.path, False, inside_protected))
                        except OSError:
                            pass
                        continue
                    _consider(
                        sandbox,
                        entry,
                        found,
                        pending,
                        inside_denied=inside_denied,
                        inside_protected=inside_protected,
                        may_be_denied=may_be_denied,
                        may_be_protected=may_be_protected,
                    )
        except PermissionError:
            # Unreadable for this user; its commands cannot list it either, but where they
            # may pass through it they can open a name they guess (``d/.env``).
            if os.access(directory, os.X_OK):
                found.unlisted.append(directory)
        except OSError:
            continue
    return _with_other_names(found)


def _consider(
    sandbox: Patterns,
    entry: os.DirEntry[str],
    found: Found,
    pending: list[tuple[str, bool, bool]],
    *,
    inside_denied: bool,
    inside_protected: bool,
    may_be_denied: Callable[[str], bool],
    may_be_protected: Callable[[str], bool],
) -> None:
    """One entry: its kind and inode number from the directory itself (no system call),
    a stat only for denied files, and the patterns matched only when the entry's name
    could match one (most names cannot: no path is built for them)."""
    try:
        is_file = entry.is_file(follow_symlinks=False)  # most entries: asked first
        is_dir = not is_file and entry.is_dir(follow_symlinks=False)
    except OSError:
        return
    if inside_denied:
        if is_dir:
            pending.append((entry.path, True, True))
        elif is_file:
            _add_inode(found, entry)
        return
    name = entry.name
    if (
        not inside_protected
        and (is_dir or is_file)
        and may_be_protected(name)
        and (
            sandbox.protected_pattern(entry.path) is not None
            or (is_dir and sandbox.protected_pattern(entry.path + EVERYTHING_BELOW) is not None)
        )
    ):
        found.protected.append(entry.path)
        inside_protected = True
    denied = may_be_denied(name) and (
        sandbox.denied_pattern(entry.path) is not None
        or (is_dir and sandbox.denied_pattern(entry.path + EVERYTHING_BELOW) is not None)
    )
    if is_dir:
        if denied:
            found.directories.append(entry.path)
        pending.append((entry.path, denied, inside_protected))
    elif is_file and denied:
        found.files.append(entry.path)
        _add_inode(found, entry)
    elif is_file:
        try:
            found.note_file(entry.inode(), entry.path)
        except OSError:
            pass


class _FarEntry:
    """An entry of a directory whose path is too long for the kernel (``long_paths``),
    listed from its descriptor: the entry, with the whole path the walk goes by."""

    __slots__ = ("_entry", "name", "path")

    def __init__(self, entry: os.DirEntry[str], directory: str) -> None:
        self._entry, self.name, self.path = entry, entry.name, directory + "/" + entry.name

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_file(follow_symlinks=follow_symlinks)

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_dir(follow_symlinks=follow_symlinks)

    def inode(self) -> int:
        return self._entry.inode()

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self._entry.stat(follow_symlinks=follow_symlinks)  # relative to the open directory


def _entries_of(directory: str) -> AbstractContextManager[Iterator[Any]]:
    """``os.scandir(directory)``; where its path is too long for the kernel, the
    directory opened in pieces and listed from its descriptor (a tree may nest past
    PATH_MAX, and a command reaches what is there one directory at a time)."""
    if long_paths.too_long(directory):
        return _far_entries(directory)
    return os.scandir(directory)


@contextmanager
def _far_entries(directory: str) -> Iterator[Iterator[_FarEntry]]:
    fd = long_paths.open_in_pieces(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with os.scandir(fd) as entries:
            yield (_FarEntry(entry, directory) for entry in entries)
    finally:
        os.close(fd)


def _add_inode(found: Found, entry: os.DirEntry[str]) -> None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return
    found.inodes.add((st.st_dev, st.st_ino))


def _with_other_names(found: Found) -> Found:
    """Other names (hard links) of the denied files: same inode number, then the same
    device and inode by a stat of each candidate (a rare few)."""
    for device, inode in found.inodes:
        for path in found.files_numbered(inode):
            try:
                st = long_paths.lstat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (device, inode):
                found.files.append(path)
    found.by_inode.clear()
    found.more_by_inode.clear()
    return found


def denied_inodes(sandbox: Patterns, *, max_entries: int = 1_000_000) -> frozenset[tuple[int, int]]:
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
