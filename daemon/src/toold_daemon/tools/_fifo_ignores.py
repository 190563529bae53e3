"""Freeing a ripgrep run that waits to open a FIFO named like an ignore file.

ripgrep reads every ``.gitignore``, ``.ignore`` and ``.rgignore`` it meets, and opening
a FIFO for reading waits until someone opens it for writing: a FIFO so named (anyone who
may write the workspace can make one) held every search below it until the call's time
limit. The tool's process has no view of /proc (its Landlock rules) to see where
ripgrep waits. So while ripgrep is silent, this looks for FIFOs with those names where
ripgrep reads them (the searched tree, and the directories from its root down to it)
and opens each for writing without waiting: that succeeds only while a reader waits,
and closed at once it gives that reader the end of the file, an empty ignore file. The
daemon's own walk passes such a FIFO over too, so both see no rules in it.
"""

from __future__ import annotations

import os
import select
import stat
from collections.abc import Iterator

IGNORE_FILES = frozenset({".gitignore", ".ignore", ".rgignore"})
#: Silence from ripgrep after which the FIFOs are looked for, and between two looks.
SILENT_SECONDS = 1.0
_CHUNK = 1 << 16
#: Bytes kept of one output line: its path (at most PATH_MAX), its line number and far
#: more than the text the tool shows of it (``grep.MAX_LINE_CHARS``). A line of a minified
#: file can be hundreds of megabytes; what is past this is read and dropped.
LINE_BYTES_KEPT = 1 << 16


def lines_freeing_fifos(stream: int, root: str, searched: str) -> Iterator[bytes]:
    """ripgrep's output lines from pipe ``stream`` until end of file, each with its
    newline (the last as it ends) and cut at ``LINE_BYTES_KEPT``; while ripgrep (searching
    ``searched``, a directory or file below ``root``) is silent for ``SILENT_SECONDS``, the
    FIFOs it may wait on are freed. A look walks the tree: while none frees anything (a
    search that is slow, not held), the next needs twice the silence, so a long quiet
    search pays a few walks, not one a second. The silence is noticed by the wait for
    output itself: no thread per search."""
    poller = select.poll()
    poller.register(stream, select.POLLIN)
    pause = SILENT_SECONDS
    started: list[bytes] = []  # the kept start of a line still arriving
    kept = 0
    while True:
        if not poller.poll(pause * 1000):
            pause = SILENT_SECONDS if release(root, searched) else pause * 2
            continue
        chunk = os.read(stream, _CHUNK)
        if not chunk:
            break
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            line = piece
            if started:  # (``kept`` never passes the bound: nothing past it was kept)
                started.append(piece[: LINE_BYTES_KEPT - kept])
                line, started, kept = b"".join(started), [], 0
            yield line[:LINE_BYTES_KEPT] + b"\n"
        if rest and kept < LINE_BYTES_KEPT:
            rest = rest[: LINE_BYTES_KEPT - kept]
            started.append(rest)
            kept += len(rest)
    if started:
        yield b"".join(started)


def release(root: str, searched: str) -> int:
    """Open for writing, without waiting, each FIFO named like an ignore file that
    ripgrep may be waiting on; how many had a reader waiting."""
    released = 0
    for fifo in _fifo_ignore_files(root, searched):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # ENXIO: nobody waits on it
            continue
        os.close(fd)
        released += 1
    return released


def _fifo_ignore_files(root: str, searched: str) -> Iterator[str]:
    # The directories from the root down to the searched one (ripgrep reads their ignore
    # files too), then everything below it; symlinks are never followed.
    top = searched if os.path.isdir(searched) else os.path.dirname(searched)
    above = os.path.relpath(top, root).split(os.sep) if top != root else []
    directories = [os.path.join(root, *above[:depth]) for depth in range(len(above))]
    for directory in directories:
        yield from _fifos_in(directory)
    pending = [top]
    while pending:
        directory = pending.pop()
        yield from _fifos_in(directory)
        try:
            with os.scandir(directory) as entries:
                pending += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue


def _fifos_in(directory: str) -> Iterator[str]:
    for name in IGNORE_FILES:
        path = os.path.join(directory, name)
        try:
            if stat.S_ISFIFO(os.stat(path, follow_symlinks=False).st_mode):
                yield path
        except OSError:
            continue
