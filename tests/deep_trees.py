"""Directory trees nested deeper than a path can name (PATH_MAX) or than recursion can
walk, for tests: made a level at a time, relative to the level above."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def nested(directory: Path, name: str, depth: int) -> Iterator[int]:
    """Make ``directory``/name/name/... (``depth`` levels) and yield a descriptor of the
    deepest one, for the test to put entries there (``dir_fd=``); closed after."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, 0o755, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def write_at(fd: int, name: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``name`` in the directory ``fd``."""
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, dir_fd=fd)
    try:
        os.write(out, text.encode())
    finally:
        os.close(out)
