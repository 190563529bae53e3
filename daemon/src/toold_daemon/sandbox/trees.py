"""Walking and removing directory trees however deep they nest.

Python 3.11's ``os.walk``, ``os.fwalk`` and ``shutil.rmtree`` call themselves once per
level, and anyone who may make directories can nest a thousand of them (``mkdir -p``
with a few kilobytes of path). One command that left such a tree in its temporary
directory made the daemon's cleanup raise ``RecursionError`` and took the daemon down,
for everyone, and the next start failed the same way on the tree left behind; a tool
that walked one failed whole. The walks here keep a stack of their own.

``remove_tree`` also keeps the number of descriptors it holds bounded: a chain deeper
than ``MAX_OPEN`` directories is moved up into the tree's top directory (a rename, in
the same directory tree) and emptied from there, so a tree a million levels deep is
removed with at most ``MAX_OPEN`` descriptors open.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

#: Directories ``remove_tree`` holds open at once, at most.
MAX_OPEN = 64
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk(
    top: str | os.PathLike[str], onerror: Callable[[OSError], None] | None = None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top, followlinks=False)``, top-down, without recursion: ``(directory,
    dirs, files)``; the caller may sort or prune ``dirs`` in place, as with ``os.walk``.
    A symlink to a directory is listed in ``dirs`` and never entered."""
    pending = [os.fspath(top)]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        dirs: list[str] = []
        files: list[str] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield directory, dirs, files
        for name in reversed(dirs):  # the first one next: the order os.walk visits them in
            below = os.path.join(directory, name)
            if not os.path.islink(below):
                pending.append(below)


def remove_tree(name: str, *, dir_fd: int | None = None, ignore_errors: bool = False) -> None:
    """``shutil.rmtree(name, dir_fd=dir_fd)`` without recursion and with at most
    ``MAX_OPEN`` descriptors open; no symlink is followed (one is removed as itself).
    With ``ignore_errors`` whatever cannot be removed is left, and nothing is raised."""
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        if ignore_errors:
            return
        raise
    try:
        while _empty_pass(top, ignore_errors):  # again while chains were moved up into it
            pass
    except OSError:
        if not ignore_errors:
            raise
    finally:
        os.close(top)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        if not ignore_errors:
            raise


def _empty_pass(top: int, ignore_errors: bool) -> bool:
    """Remove what is in directory ``top``, depth first; a directory met ``MAX_OPEN``
    levels down is moved up into ``top`` instead of entered. Whether any was."""
    moved = False
    # (its descriptor, its listing, its name in the directory above)
    stack: list[tuple[int, Iterator[os.DirEntry[str]], str]] = [(top, iter(_listed(top)), "")]
    try:
        while stack:
            fd, entries, _ = stack[-1]
            entry = next(entries, None)
            if entry is None:  # emptied: removed from the directory above (top is the caller's)
                _, _, emptied = stack.pop()
                if stack:
                    os.close(fd)
                    _quietly(ignore_errors, os.rmdir, emptied, dir_fd=stack[-1][0])
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                _quietly(ignore_errors, os.unlink, entry.name, dir_fd=fd)
            elif len(stack) >= MAX_OPEN:
                moved |= _quietly(ignore_errors, _move_up, entry.name, fd, top)
            else:
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    if not ignore_errors:
                        raise
                    continue
                stack.append((child, iter(_listed(child)), entry.name))
    finally:
        for fd, _, _ in stack[1:]:
            os.close(fd)
    return moved


def _listed(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as listing:
        return list(listing)


def _move_up(name: str, fd: int, top: int) -> None:
    """Move directory ``name`` (in ``fd``) into ``top`` under a name of its own."""
    os.rename(name, f".toold-removing-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top)


def _quietly(ignore_errors: bool, action: Callable[..., object], *args: object, **kwargs: object) -> bool:
    """``action(*args, **kwargs)``; True once done. An OSError is raised, or with
    ``ignore_errors`` passed over (False)."""
    try:
        action(*args, **kwargs)
    except OSError:
        if not ignore_errors:
            raise
        return False
    return True
