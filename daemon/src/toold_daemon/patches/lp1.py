"""LP1, a line-addressed patch format that ``apply_patch`` accepts beside ``*** Begin Patch``."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ..tools._text import Text
from .model import FileChange, Lines, PatchError

_BLOCK_OPS = {"R": 2, "I": 2, "P": 2, "E": 1, "T": 1, "B": 1}


class Op(msgspec.Struct):
    kind: str
    occurrence: int | None = None
    blocks: list[list[str]] = msgspec.field(default_factory=list)
    flag: str = ""


class Section(msgspec.Struct):
    path: str
    ops: list[Op] = msgspec.field(default_factory=list)


def parse(patch: str) -> list[Section]:
    lines = patch.split("\n")
    index = _skip_blank(lines, 0)
    if index >= len(lines):
        raise PatchError("", "missing LP1 header")
    header = lines[index].strip()
    if header != "LP1":
        raise PatchError("", f"wrong header {header[:20]!r}: expected LP1")
    index += 1
    sections: list[Section] = []
    while True:
        index = _skip_blank(lines, index)
        if index >= len(lines):
            raise PatchError("", "missing END")
        line = lines[index].rstrip("\r")
        word, _, rest = line.strip().partition(" ")
        index += 1
        if word == "END":
            return sections
        if word == "F":
            sections.append(Section(_path(rest.strip())))
            continue
        if not sections:
            raise PatchError("", f"operation {word!r} before any F line")
        op, index = _operation(word, rest.strip(), lines, index, sections[-1].path)
        sections[-1].ops.append(op)


def _skip_blank(lines: list[str], index: int) -> int:
    while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
        index += 1
    return index


def _path(text: str) -> str:
    if not text:
        raise PatchError("", "F line without a path")
    if not text.startswith('"'):
        if any(c.isspace() for c in text) or '"' in text:
            raise PatchError("", f"bad path {text!r}: quote paths with spaces")
        return text
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
            continue
        if ch == '"':
            if text[i + 1 :].strip():
                raise PatchError("", f"text after the quoted path {text!r}")
            return "".join(out)
        out.append(ch)
        i += 1
    raise PatchError("", f"unterminated quoted path {text!r}")


def _operation(word: str, rest: str, lines: list[str], index: int, path: str) -> tuple[Op, int]:
    if word == "N":
        if rest not in ("+", "-"):
            raise PatchError(path, f"bad N flag {rest!r}: use N + or N -")
        return Op("N", flag=rest), index
    if word not in _BLOCK_OPS:
        raise PatchError(path, f"unknown operation {word!r}")
    occurrence = None
    if rest:
        if word in ("T", "B"):
            raise PatchError(path, f"{word} takes no occurrence")
        if not rest.isdigit():
            raise PatchError(path, f"bad occurrence {rest!r}")
        occurrence = int(rest)
        if occurrence < 1:
            raise PatchError(path, "occurrence must be 1 or more")
    op = Op(word, occurrence)
    for _ in range(_BLOCK_OPS[word]):
        block, index = _block(lines, index, path)
        op.blocks.append(block)
    return op, index


def _block(lines: list[str], index: int, path: str) -> tuple[list[str], int]:
    block: list[str] = []
    while index < len(lines):
        line = lines[index].rstrip("\r")
        index += 1
        if line.rstrip(" \t") == ".":
            return block, index
        if line.startswith(".."):
            block.append(line[1:])
        elif line.startswith("."):
            raise PatchError(path, f"bad dot-stuffing in block line {line[:40]!r} (write '..' for a leading '.')")
        else:
            block.append(line)
    raise PatchError(path, "block not terminated by a '.' line")


def paths(patch: str) -> list[str]:
    return [section.path for section in parse(patch)]


def apply(patch: str, load: Callable[[str], Text | None]) -> list[FileChange]:
    changes: dict[str, tuple[Text | None, Lines]] = {}
    for section in parse(patch):
        if section.path in changes:
            before, doc = changes[section.path]
        else:
            before = load(section.path)
            doc = Lines.of(before.body) if before is not None else Lines([], True)
            changes[section.path] = (before, doc)
        for op in section.ops:
            _apply_op(op, doc, exists=before is not None, path=section.path)
    return [
        FileChange(
            path,
            "add" if before is None else "update",
            before,
            (before or Text("")).with_body(doc.body()),
        )
        for path, (before, doc) in changes.items()
    ]


def _apply_op(op: Op, doc: Lines, *, exists: bool, path: str) -> None:
    if op.kind == "N":
        if op.flag == "+":
            doc.final_newline = True
            if not doc.lines:
                doc.lines = [""]
        else:
            doc.final_newline = False
            if doc.lines == [""]:
                doc.lines = []
        return
    if op.kind == "T":
        doc.lines.extend(op.blocks[0])
        return
    if op.kind == "B":
        doc.lines[:0] = op.blocks[0]
        return
    if not exists:
        raise PatchError(path, f"{op.kind} on a file that does not exist")
    find = op.blocks[0]
    if not find:
        raise PatchError(path, f"{op.kind}: empty find block")
    at = _locate(doc.lines, find, op.occurrence, path)
    new = op.blocks[1] if len(op.blocks) > 1 else []
    end = at + len(find)
    if op.kind == "R":
        doc.lines[at:end] = new
    elif op.kind == "I":
        doc.lines[end:end] = new
    elif op.kind == "P":
        doc.lines[at:at] = new
    elif op.kind == "E":
        del doc.lines[at:end]


def _locate(lines: list[str], find: list[str], occurrence: int | None, path: str) -> int:
    starts = [i for i in range(len(lines) - len(find) + 1) if lines[i : i + len(find)] == find]
    preview = "⏎".join(find)[:60]
    if not starts:
        raise PatchError(path, f"match not found: {preview!r}")
    if occurrence is None:
        if len(starts) > 1:
            raise PatchError(path, f"match not unique ({len(starts)} matches): {preview!r}; give an occurrence")
        return starts[0]
    if occurrence > len(starts):
        raise PatchError(path, f"occurrence {occurrence} out of range ({len(starts)} matches): {preview!r}")
    return starts[occurrence - 1]
