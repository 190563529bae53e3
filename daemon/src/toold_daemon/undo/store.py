"""Where pre-images live: the daemon's state directory, content-addressed, 0600.

A blob is named by the SHA-256 of its bytes, so a file kept by many batches is stored
once and a blob is never rewritten. The journal holds which batch changed which path
(``changes``) and is the only index: blobs no row names any more (their batches were
pruned) are removed by ``collect``.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from ..records.state_files import refuse_links, write_through
from .images import digest

UNDO_DIR = "undo"


class UndoStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        refuse_links(directory)  # chmod and the removal of old blobs would follow it
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)

    @classmethod
    def open_in(cls, state_dir: Path) -> UndoStore:
        return cls(state_dir / UNDO_DIR)

    def put(self, data: bytes) -> str:
        """Keep ``data``; return its name (its hash)."""
        name = digest(data)
        path = self.directory / name
        if path.exists():
            os.utime(path)  # kept anew: a collection running now must not take it (``recent_seconds``)
            return name
        write_through(self.directory / f".{name}.{secrets.token_hex(4)}.tmp", path, data)
        return name

    def get(self, name: str) -> bytes | None:
        if len(name) != 64 or not all(c in "0123456789abcdef" for c in name):
            return None
        try:
            fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return data if digest(data) == name else None

    def collect(self, referenced: set[str], *, recent_seconds: float = 0.0) -> int:
        """Remove blobs no journal row names; the number removed. While the daemon serves,
        a blob kept after ``referenced`` was read is not in it: blobs kept (or kept anew)
        within ``recent_seconds`` stay."""
        removed = 0
        newest = time.time() - recent_seconds
        for entry in os.scandir(self.directory):
            if entry.name not in referenced and (not recent_seconds or _modified(entry) < newest):
                try:
                    os.unlink(entry.path)
                    removed += 1
                except OSError:
                    pass
        return removed


def _modified(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return float("inf")  # gone or unreadable: not ours to remove now
