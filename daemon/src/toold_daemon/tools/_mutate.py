"""Shared by the tools that change files: stale-file checks and read-tracking records."""

from __future__ import annotations

import os
from pathlib import Path

from toold_protocol import ToolErrorType

from ..errors import ToolError
from ._base import ToolContext
from ._text import sha256


def check_fresh(ctx: ToolContext, path: Path, current: bytes, *, dir_fd: int, name: str, shown: str) -> None:
    """Refuse to change a file this session has not read, or that changed since it did."""
    if not ctx.config.tools.edit.require_read:
        return
    record = ctx.reads.get(str(path))
    if record is None:
        raise ToolError(
            ToolErrorType.STALE_FILE,
            "STALE_FILE",
            f"StaleFile: {shown} has not been read in this session; read it with read_file first",
            path=shown,
            reason="not_read",
        )
    kind, _, value = record.partition(":")
    if kind == "sha256":
        fresh = sha256(current) == value
    else:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        fresh = value == f"{st.st_size}:{st.st_mtime_ns}"
    if not fresh:
        raise ToolError(
            ToolErrorType.STALE_FILE,
            "STALE_FILE",
            f"StaleFile: {shown} changed since it was last read; read it again before changing it",
            path=shown,
            reason="changed",
        )


def written(path: Path, data: bytes) -> dict[str, str]:
    return {str(path): f"sha256:{sha256(data)}"}


def gone(path: Path) -> dict[str, str]:
    return {str(path): ""}
