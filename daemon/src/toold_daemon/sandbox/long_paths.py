"""Paths longer than the kernel takes in one system call (``PATH_MAX``, 4096 bytes).

Every name in a tree may be short while the path of an entry deep in it is not: a
command reaches such an entry by changing directory one name at a time, but ``open``,
``stat`` or ``mount`` of its whole path fail with ``ENAMETOOLONG``. What must see every
entry below the roots (the denied-file walk, the views mounted over what it finds) opens
such a path a name at a time, each relative to the directory before, following no
symlink. A short path is used as it is: nothing changes for it, and nothing is spent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: Past this many bytes a path is opened a name at a time (PATH_MAX is 4096).
PIECE_BYTES = 3800
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)


def too_long(path: str) -> bool:
    """Whether ``path`` cannot be given to the kernel whole. (A character is at most
    four bytes: a path of fewer than ``PIECE_BYTES // 4`` characters is never encoded.)"""
    return len(path) > PIECE_BYTES // 4 and len(os.fsencode(path)) > PIECE_BYTES


def open_in_pieces(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CLOEXEC)`` for a path of any length. A path too long
    for the kernel is opened a name at a time, each relative to the directory before,
    and no symlink on the way is followed (``O_NOFOLLOW`` at every name): the walk found
    each of these names as a directory, and one swapped for a symlink since must not
    lead it elsewhere."""
    flags |= os.O_CLOEXEC
    data = os.fsencode(path)
    if len(data) <= PIECE_BYTES:
        return os.open(data, flags)
    *directories, last = data.split(b"/")
    fd = os.open(b"/" if data.startswith(b"/") else b".", _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in directories:
            if not name:  # (the root's empty name, or a doubled slash)
                continue
            inner = os.open(name, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(last, flags, dir_fd=fd)
    finally:
        os.close(fd)


def lstat(path: str) -> os.stat_result:
    """``os.stat(path, follow_symlinks=False)`` for a path of any length."""
    if not too_long(path):
        return os.stat(path, follow_symlinks=False)
    fd = open_in_pieces(path, _O_PATH | os.O_NOFOLLOW)
    try:
        return os.stat(fd)
    finally:
        os.close(fd)


@contextmanager
def reachable(path: str) -> Iterator[str]:
    """A name the kernel takes for ``path`` meanwhile: ``path`` itself, or, when it is
    too long, ``/proc/self/fd/N`` of it opened in pieces (``mount`` follows that link to
    the entry itself). Open it again after mounting on it to reach the new mount."""
    if not too_long(path):
        yield path
        return
    fd = open_in_pieces(path, _O_PATH | os.O_NOFOLLOW)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
