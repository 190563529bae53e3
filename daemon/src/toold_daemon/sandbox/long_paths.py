"""Paths longer than the kernel takes in one system call (``PATH_MAX``, 4096 bytes).

Every name in a tree may be short while the path of an entry deep in it is not: a
command reaches such an entry by changing directory one name at a time, but ``open``,
``stat`` or ``mount`` of its whole path fail with ``ENAMETOOLONG``. What must see every
entry below the roots (the denied-file walk, the views mounted over what it finds) opens
such a path in pieces, each below the limit and each relative to the directory the last
one opened. A short path is used as it is: nothing changes for it, and nothing is spent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

#: Bytes of a path opened at once: below PATH_MAX (4096) with room for one more name.
PIECE_BYTES = 3800
_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)


def too_long(path: str) -> bool:
    """Whether ``path`` cannot be given to the kernel whole. (A character is at most
    four bytes: a path of fewer than ``PIECE_BYTES // 4`` characters is never encoded.)"""
    return len(path) > PIECE_BYTES // 4 and len(os.fsencode(path)) > PIECE_BYTES


def open_in_pieces(path: str, flags: int) -> int:
    """``os.open(path, flags | O_CLOEXEC)`` for a path of any length. The directories
    on the way are opened ``PIECE_BYTES`` at a time; the end of each piece is never a
    symlink followed (``O_NOFOLLOW``), as no entry the walk found was one."""
    flags |= os.O_CLOEXEC
    data = os.fsencode(path)
    if len(data) <= PIECE_BYTES:
        return os.open(data, flags)
    head, _, last = data.rpartition(b"/")
    fd = -1
    try:
        for piece in _pieces(head):
            opened = os.open(piece, _O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=_at(fd))
            if fd >= 0:
                os.close(fd)
            fd = opened
        return os.open(last, flags, dir_fd=_at(fd))
    finally:
        if fd >= 0:
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


def _pieces(head: bytes) -> Iterator[bytes]:
    """``head`` (an absolute directory path) cut at slashes into pieces of at most
    ``PIECE_BYTES``: the first absolute, the others relative to the one before."""
    names = head.split(b"/")
    piece: list[bytes] = [b""]  # the root: the first piece starts with "/"
    size = 0
    for name in names[1:]:
        if size + len(name) + 1 > PIECE_BYTES:
            yield b"/".join(piece) or b"/"
            piece, size = [], 0
        piece.append(name)
        size += len(name) + 1
    if piece and piece != [b""]:
        yield b"/".join(piece)


def _at(fd: int) -> int | None:
    return fd if fd >= 0 else None
