"""The ``*** Begin Patch`` format (the format OpenAI models emit).

Hunks apply in order, each searching forward from where the previous one ended:
exact lines first, then ignoring trailing whitespace, then ignoring surrounding
whitespace. A hunk whose old side matches in several places at the same strictness is
narrowed by its ``@@`` header line; still ambiguous is an error — never a guess.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..tools._text import Text
from .model import FileChange, Lines, PatchError

BEGIN, END = "*** Begin Patch", "*** End Patch"
ADD, DELETE, UPDATE, MOVE = "*** Add File: ", "*** Delete File: ", "*** Update File: ", "*** Move to: "
END_OF_FILE = "*** End of File"


class Hunk(msgspec.Struct):
    header: str
    old: list[str] = msgspec.field(default_factory=list)
    new: list[str] = msgspec.field(default_factory=list)
    at_end: bool = False


class Operation(msgspec.Struct):
    action: str  # add, delete, update
    path: str
    move_to: str | None = None
    added: list[str] = msgspec.field(default_factory=list)
    hunks: list[Hunk] = msgspec.field(default_factory=list)


def parse(patch: str) -> list[Operation]:
    lines = [line.rstrip("\r") for line in patch.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start >= len(lines) or lines[start].strip() != BEGIN:
        raise PatchError("", f"the patch must start with {BEGIN!r}")
    if lines[-1].strip() != END:
        raise PatchError("", f"the patch must end with {END!r}")
    operations: list[Operation] = []
    for number, line in enumerate(lines[start + 1 : -1], start=start + 2):
        _parse_line(line, number, operations)
    for op in operations:
        if op.action == "update" and not op.hunks and op.move_to is None:
            raise PatchError(op.path, "Update File without hunks")
    return operations


def _parse_line(line: str, number: int, operations: list[Operation]) -> None:
    # Blanks before a file header are accepted where no body line can be meant: before
    # the first file, and after an added file's '+' lines or a deletion (as Codex does).
    # Inside an update, a line starting with a blank is context, whatever follows.
    if line[:1].isspace() and (not operations or operations[-1].action != "update"):
        line = line.lstrip()
    for prefix, action in ((ADD, "add"), (DELETE, "delete"), (UPDATE, "update")):
        if line.startswith(prefix):
            path = line[len(prefix) :].strip()
            if not path:
                raise PatchError("", f"line {number}: {prefix.strip()} without a path")
            operations.append(Operation(action, path))
            return
    if not operations:
        raise PatchError("", f"line {number}: expected a file header, got {line[:40]!r}")
    op = operations[-1]
    if line.startswith(MOVE) and op.action == "update" and not op.hunks:
        op.move_to = line[len(MOVE) :].strip()
        return
    if line.startswith("***"):
        if line.strip() == END_OF_FILE and op.hunks:
            op.hunks[-1].at_end = True
            return
        raise PatchError(op.path, f"line {number}: unknown header {line[:40]!r}")
    if op.action == "add":
        if not line.startswith("+"):
            raise PatchError(op.path, f"line {number}: every line of an added file starts with '+'")
        op.added.append(line[1:])
        return
    if op.action == "delete":
        raise PatchError(op.path, f"line {number}: Delete File takes no body")
    if line.startswith("@@"):
        op.hunks.append(Hunk(line[2:].strip()))
        return
    if not op.hunks:
        op.hunks.append(Hunk(""))  # a body without a leading @@ (models emit this)
    hunk = op.hunks[-1]
    kind, text = (line[:1], line[1:]) if line else (" ", "")
    if kind == " ":
        hunk.old.append(text)
        hunk.new.append(text)
    elif kind == "-":
        hunk.old.append(text)
    elif kind == "+":
        hunk.new.append(text)
    else:
        raise PatchError(op.path, f"line {number}: hunk line must start with ' ', '-' or '+': {line[:40]!r}")


def paths(patch: str) -> list[str]:
    found: list[str] = []
    for op in parse(patch):
        found.append(op.path)
        if op.move_to:
            found.append(op.move_to)
    return found


def apply(patch: str, load: Callable[[str], Text | None]) -> list[FileChange]:
    changes: list[FileChange] = []
    for op in parse(patch):
        before = load(op.path)
        if op.action == "add":
            if before is not None:
                raise PatchError(op.path, "Add File on a file that exists")
            changes.append(FileChange(op.path, "add", None, Text("\n".join(op.added) + ("\n" if op.added else ""))))
            continue
        if before is None:
            raise PatchError(op.path, f"{op.action.capitalize()} File on a file that does not exist")
        if op.action == "delete":
            changes.append(FileChange(op.path, "delete", before, None))
            continue
        doc = Lines.of(before.body)
        cursor = 0
        for number, hunk in enumerate(op.hunks, start=1):
            cursor = _apply_hunk(doc, hunk, cursor, op.path, number)
        changes.append(FileChange(op.path, "update", before, before.with_body(doc.body()), op.move_to))
    return changes


def _apply_hunk(doc: Lines, hunk: Hunk, cursor: int, path: str, number: int) -> int:
    lines = doc.lines
    if not hunk.old:  # a pure insertion: after the header line, else at the end
        at = _header_line(lines, hunk.header, cursor) + 1 if hunk.header else len(lines)
        if at == 0 and hunk.header:
            raise PatchError(path, f"hunk {number}: header {hunk.header[:40]!r} not found")
        lines[at:at] = hunk.new
        return at + len(hunk.new)
    at = _find(lines, hunk, cursor, path, number)
    lines[at : at + len(hunk.old)] = hunk.new
    if not lines and doc.final_newline:
        doc.final_newline = False
    return at + len(hunk.new)


def _header_line(lines: list[str], header: str, cursor: int) -> int:
    for i in range(cursor, len(lines)):
        if lines[i].strip() == header.strip():
            return i
    return -1


_NORMALIZERS: list[Callable[[str], str]] = [lambda s: s, str.rstrip, str.strip]


def _find(lines: list[str], hunk: Hunk, cursor: int, path: str, number: int) -> int:
    size = len(hunk.old)
    candidates = (
        range(len(lines) - size, len(lines) - size + 1) if hunk.at_end else range(cursor, len(lines) - size + 1)
    )
    for normalize in _NORMALIZERS:
        old = [normalize(x) for x in hunk.old]
        found = [i for i in candidates if i >= 0 and [normalize(x) for x in lines[i : i + size]] == old]
        if len(found) > 1 and hunk.header:
            header_at = _header_line(lines, hunk.header, cursor)
            found = [i for i in found if i > header_at][:1] if header_at >= 0 else found
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise PatchError(path, f"hunk {number}: its old lines match {len(found)} places; add context")
    preview = "⏎".join(hunk.old)[:60]
    raise PatchError(path, f"hunk {number}: old lines not found: {preview!r}")
