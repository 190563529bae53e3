"""Text files as edits see them: UTF-8, LF inside, with the file's line ending and BOM
remembered so that writing back changes only what was edited.

Mixed LF/CRLF files are written back with the majority ending (LF on a tie); a bare CR
or bytes that are not UTF-8 make a file uneditable (a clear error, not a guess).
"""

from __future__ import annotations

import difflib
import hashlib
import re

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


#: Lines of each side the changed region may have and still be compared line by line:
#: difflib takes time quadratic in lines that recur (2.2 s for 32,000 lines drawn from 320,
#: minutes for a few MB). Past it the region is said, not compared.
DIFF_MAX_LINES = 5_000
_CONTEXT = 3
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def unified_diff(before: str, after: str, shown: str, *, max_chars: int = 50_000) -> str:
    """A unified diff, cut at ``max_chars``. The lines both sides begin and end with are
    set aside first (but for the context around the change), so that an edit of a large
    file compares only the region it changed; a changed region past ``DIFF_MAX_LINES``
    lines is summarised instead of compared."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    prefix = _common_prefix(a, b)
    suffix = _common_prefix(a[prefix:][::-1], b[prefix:][::-1])
    low = max(0, prefix - _CONTEXT)
    tail = max(0, suffix - _CONTEXT)
    a_part, b_part = a[low : len(a) - tail], b[low : len(b) - tail]
    changed_a, changed_b = len(a) - prefix - suffix, len(b) - prefix - suffix
    if max(changed_a, changed_b) > DIFF_MAX_LINES:
        lines = [
            f"--- a/{shown}\n",
            f"+++ b/{shown}\n",
            f"@@ -{prefix + 1},{changed_a} +{prefix + 1},{changed_b} @@\n",
            f"[... {changed_a} line(s) replaced by {changed_b}: too many to compare line by line]\n",
        ]
    else:
        hunks = difflib.unified_diff(a_part, b_part, f"a/{shown}", f"b/{shown}")
        lines = [_shifted(line, low) for line in hunks]
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


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _shifted(line: str, offset: int) -> str:
    """A hunk header of a diff of a slice starting ``offset`` lines in, made to count
    from the file's start (other lines as they are)."""
    if not offset or not line.startswith("@@"):
        return line
    match = _HUNK.match(line)
    if match is None:
        return line
    old_start, old_len, new_start, new_len = match.groups()
    rest = line[match.end() :]
    return f"@@ -{int(old_start) + offset}{old_len or ''} +{int(new_start) + offset}{new_len or ''} @@{rest}"
