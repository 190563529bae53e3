"""Patch formats for apply_patch: LP1 and ``*** Begin Patch``, parsed and applied in memory.

Both produce the same thing: a list of ``FileChange`` computed from the current
contents (given by a loader), so the tool can stage every file before writing any.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

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
    found = _paths_once(patch)
    if isinstance(found, PatchError):
        raise PatchError(found.path, found.reason)
    return list(found)


@lru_cache(maxsize=16)
def _paths_once(patch: str) -> tuple[str, ...] | PatchError:
    """One parse per patch text, or why it failed: planning one call asks for its paths
    four times (validation, the sandbox check, the summary, the locations), and a
    256 KB patch takes tens of milliseconds to parse."""
    try:
        return tuple(begin_patch.paths(patch) if detect(patch) == "begin_patch" else lp1.paths(patch))
    except PatchError as exc:
        return exc.with_traceback(None)  # kept: its frames need not be


def apply(patch: str, load: Loader) -> list[FileChange]:
    return begin_patch.apply(patch, load) if detect(patch) == "begin_patch" else lp1.apply(patch, load)


__all__ = ["FileChange", "Loader", "PatchError", "apply", "detect", "paths"]
