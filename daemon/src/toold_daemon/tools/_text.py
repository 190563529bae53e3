"""Text files as edits see them: UTF-8, LF inside, with the file's line ending and BOM
remembered so that writing back changes only what was edited.

Mixed LF/CRLF files are written back with the majority ending (LF on a tie); a bare CR
or bytes that are not UTF-8 make a file uneditable (a clear error, not a guess).
"""

from __future__ import annotations

import difflib
import hashlib

import msgspec

from toold_protocol import ToolErrorType

from ..errors import ToolError

BOM = "\ufeff"


class Text(msgspec.Struct, frozen=True):
    body: str  # LF line endings, no BOM
    crlf: bool = False
    bom: bool = False

    def encode(self) -> bytes:
        body = self.body.replace("\n", "\r\n") if self.crlf else self.body
        return ((BOM if self.bom else "") + body).encode("utf-8")

    def with_body(self, body: str) -> Text:
        return Text(body, self.crlf, self.bom)


def decode(data: bytes, shown: str) -> Text:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED, "NOT_UTF8", f"{shown} is not UTF-8 text (byte {exc.start})", path=shown
        ) from None
    bom = text.startswith(BOM)
    if bom:
        text = text[1:]
    crlf_count = text.count("\r\n")
    if "\r" in text.replace("\r\n", ""):
        raise ToolError(ToolErrorType.EXECUTION_FAILED, "BARE_CR", f"{shown} has a bare CR line ending", path=shown)
    lf_count = text.count("\n") - crlf_count
    return Text(text.replace("\r\n", "\n"), crlf=crlf_count > lf_count, bom=bom)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unified_diff(before: str, after: str, shown: str, *, max_chars: int = 50_000) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{shown}", f"b/{shown}"
    )
    out: list[str] = []
    size = 0
    for line in lines:
        shown_line = line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        size += len(shown_line)
        if size > max_chars:
            out.append("[... diff truncated]\n")
            break
        out.append(shown_line)
    return "".join(out)
