"""Patch formats for apply_patch: LP1 and ``*** Begin Patch``, parsed and applied in memory.

Both produce the same thing: a list of ``FileChange`` computed from the current
contents (given by a loader), so the tool can stage every file before writing any.
"""

from __future__ import annotations

from collections.abc import Callable

from ..tools._text import Text
from . import begin_patch, lp1
from .model import FileChange, PatchError

Loader = Callable[[str], Text | None]


def detect(patch: str) -> str:
    """``lp1`` or ``begin_patch``, from the first meaningful line."""
    for line in patch.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        return "begin_patch" if stripped.startswith("***") else "lp1"
    raise PatchError("", "the patch is empty")


def paths(patch: str) -> list[str]:
    """Every path the patch touches (for sandbox checks while planning)."""
    return begin_patch.paths(patch) if detect(patch) == "begin_patch" else lp1.paths(patch)


def apply(patch: str, load: Loader) -> list[FileChange]:
    return begin_patch.apply(patch, load) if detect(patch) == "begin_patch" else lp1.apply(patch, load)


__all__ = ["FileChange", "Loader", "PatchError", "apply", "detect", "paths"]
