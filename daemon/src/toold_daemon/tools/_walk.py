"""Walking a directory tree inside the sandbox, as git would see it.

Shared by ``list_directory``, ``glob``, ``read_many_files`` and grep's pure-Python engine.
The walk holds directory file descriptors and opens each subdirectory relative
to its parent with ``O_NOFOLLOW``, so a directory swapped for a symlink mid-walk is
skipped rather than followed. Symlinks are reported, never followed.

``.gitignore`` files apply as in git: every ``.gitignore`` from the sandbox root down
to the directory being read, deeper files overriding shallower ones, the last
matching line of a file winning, ``!`` negations re-including, and an ignored
directory never entered (so nothing below it can be re-included). ``.git`` is never
listed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..errors import ToolError
from ..sandbox import Sandbox
from ..sandbox.reads import read_at_most
from ._base import ToolContext
from ._gitignore import GitIgnore

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_GITIGNORE_BYTES = 1 << 20
#: Directories a walk enters below its start, at most: each is open while the walk is
#: below it, and a tool's process may hold 1,024 descriptors (no project nests so deep).
DEEPEST = 256


class Entry(msgspec.Struct, frozen=True):
    path: Path  # absolute
    rel: str  # relative to the walk's start, forward slashes
    name: str
    kind: str  # file | dir | symlink | other
    size: int
    mtime: float
    depth: int  # 1 for direct children of the start


class _IgnoreFile(msgspec.Struct, frozen=True):
    """A parsed ``.gitignore`` and how to turn a walk-relative path into one relative to it.

    For a file at or below the walk's start, ``base`` is its directory relative to the
    start (stripped from paths); for an ancestor of the start, ``prefix`` is the start
    relative to that ancestor (put in front of paths).
    """

    spec: GitIgnore
    base: str = ""
    prefix: str = ""

    def local(self, rel: str) -> str | None:
        if self.prefix:
            return f"{self.prefix}/{rel}"
        if not self.base:
            return rel
        if rel.startswith(self.base + "/"):
            return rel[len(self.base) + 1 :]
        return None


class Walker:
    def __init__(
        self,
        sandbox: Sandbox,
        ctx: ToolContext | None = None,
        *,
        include_hidden: bool = False,
        respect_gitignore: bool = True,
        max_depth: int | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.ctx = ctx
        self.include_hidden = include_hidden
        self.respect_gitignore = respect_gitignore
        self.max_depth = max_depth
        self.too_deep = 0  # directories past DEEPEST, not entered

    def walk(self, start: Path) -> Iterator[Entry]:
        """Entries below canonical directory ``start``, depth first, sorted by name in
        each directory. Without recursion, and at most ``DEEPEST`` directories down
        (each one open meanwhile): ``too_deep`` counts the directories not entered."""
        fd = self.sandbox.open_dir(start, display=self.sandbox.display(start))
        ignores = self._ancestor_ignores(start) if self.respect_gitignore else []
        # One frame per directory being read: its fd, path, relative path, depth, the
        # .gitignore files in force there, and its entries not yet looked at.
        stack = [self._frame(fd, start, "", 1, ignores)]
        try:
            while stack:
                fd, path, rel, depth, ignores, entries = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    stack.pop()
                    os.close(fd)
                    continue
                found = self._consider(entry, path, rel, depth, ignores)
                if found is None:
                    continue
                yield found
                if found.kind != "dir" or (self.max_depth is not None and depth >= self.max_depth):
                    continue
                if depth >= DEEPEST:
                    self.too_deep += 1
                    continue
                try:
                    child_fd = os.open(found.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # vanished or swapped for a symlink: not followed
                stack.append(self._frame(child_fd, found.path, found.rel, depth + 1, ignores))
        finally:
            for frame in stack:
                os.close(frame[0])

    def _frame(
        self, fd: int, path: Path, rel: str, depth: int, ignores: list[_IgnoreFile]
    ) -> tuple[int, Path, str, int, list[_IgnoreFile], Iterator[os.DirEntry[str]]]:
        """A directory to read: its entries sorted by name, and its .gitignore in force."""
        if self.ctx is not None:
            self.ctx.check_cancelled()
        try:
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            entries = []
        if self.respect_gitignore and any(e.name == ".gitignore" for e in entries):
            spec = _read_gitignore(fd)
            if spec is not None:
                ignores = [*ignores, _IgnoreFile(spec, base=rel)]
        return fd, path, rel, depth, ignores, iter(entries)

    def _consider(
        self, entry: os.DirEntry[str], path: Path, rel: str, depth: int, ignores: list[_IgnoreFile]
    ) -> Entry | None:
        """``entry`` as the walk reports it, or None where it is not shown (hidden,
        ignored, denied, gone)."""
        name = entry.name
        if name == ".git" or (not self.include_hidden and name.startswith(".")):
            return None
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return None
        kind = _kind(st.st_mode)
        child_rel = f"{rel}/{name}" if rel else name
        if ignores and _ignored(ignores, child_rel, kind == "dir"):
            return None
        child = path / name
        if self.sandbox.denied_pattern(child) is not None:
            return None
        return Entry(child, child_rel, name, kind, st.st_size, st.st_mtime, depth)

    def _ancestor_ignores(self, start: Path) -> list[_IgnoreFile]:
        """``.gitignore`` files from the sandbox root down to ``start``'s parent, rebased on ``start``."""
        root = self.sandbox.root_of(start)
        if root is None or root == start:
            return []
        found: list[_IgnoreFile] = []
        rel_parts = start.relative_to(root).parts
        for depth in range(len(rel_parts)):
            directory = root.joinpath(*rel_parts[:depth])
            try:
                fd = self.sandbox.open_dir(directory)
            except ToolError:  # an unreadable ancestor contributes no rules
                continue
            try:
                spec = _read_gitignore(fd)
            finally:
                os.close(fd)
            if spec is not None:
                # Paths below start are matched as "<rest of start>/<rel>" from this directory.
                found.append(_IgnoreFile(spec, prefix="/".join(rel_parts[depth:])))
        return found


def not_entered(directories: int) -> str:
    """What a tool says of the directories its walk did not enter (``DEEPEST``)."""
    counted = f"{directories} director{'y' if directories == 1 else 'ies'}"
    return f"[{counted} nested more than {DEEPEST} levels down not entered]"


def _ignored(ignores: list[_IgnoreFile], rel: str, is_dir: bool) -> bool:
    """Deepest ``.gitignore`` with a matching line decides; within it, the last matching line."""
    for ignore in reversed(ignores):
        local = ignore.local(rel)
        if local is None:
            continue
        decided = ignore.spec.decides(local, is_dir=is_dir)
        if decided is not None:
            return decided
    return False


def _read_gitignore(dir_fd: int) -> GitIgnore | None:
    try:
        # (O_NONBLOCK: a FIFO named .gitignore would hold the open until a writer came)
        fd = os.open(".gitignore", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        data = read_at_most(fd, _MAX_GITIGNORE_BYTES, st.st_size)
    finally:
        os.close(fd)
    return GitIgnore(data.decode("utf-8", "replace").splitlines())


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"
