"""What applying a patch yields, and how it fails."""

from __future__ import annotations

from typing import Literal

import msgspec

from ..tools._text import Text


class PatchError(Exception):
    """A patch that cannot be applied; ``path`` names the file ("" for the patch itself)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason


class FileChange(msgspec.Struct, frozen=True):
    path: str
    action: Literal["add", "update", "delete"]
    before: Text | None  # None for a new file
    after: Text | None  # None for a deletion
    move_to: str | None = None


class Lines(msgspec.Struct):
    """A text file as lines plus whether it ends with a newline (LP1's model)."""

    lines: list[str]
    final_newline: bool

    @classmethod
    def of(cls, body: str) -> Lines:
        if body == "":
            return cls([], False)
        final = body.endswith("\n")
        return cls((body[:-1] if final else body).split("\n"), final)

    def body(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.final_newline and self.lines else "")
