"""edit_file (alias edit): exact-text replacements, applied in order, all or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..errors import ToolError, bad_args
from ..sandbox.writes import atomic_write, for_new_contents, parent_dir, read_existing
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import EditFileData
from ._mutate import check_fresh, written
from ._text import Text, decode, unified_diff


class Edit(ToolArgs, frozen=True):
    target: Annotated[str, Meta(min_length=1, description="Exact text to find (whole lines not required)")]
    replacement: Annotated[str, Meta(description="Text to put in its place")]
    occurrence: (
        Annotated[int, Meta(ge=1, description="Which match to replace (1-based); needed when not unique")] | None
    ) = None


class EditFileArgs(ToolArgs, frozen=True):
    """Edit a file by exact replacements."""

    path: Annotated[str, Meta(description="File path relative to the workspace root")]
    edits: Annotated[list[Edit], Meta(min_length=1, max_length=100)]


def apply_edits(text: str, edits: list[Edit]) -> str:
    """Apply each edit to the text the previous ones produced. Targets and replacements
    use LF line endings (a CRLF file is converted around this). Raises on the first
    edit that does not match exactly once (or at its ``occurrence``); nothing is half-done."""
    for index, edit in enumerate(edits):
        target = edit.target.replace("\r\n", "\n")
        replacement = edit.replacement.replace("\r\n", "\n")
        starts = _find_all(text, target)
        if not starts:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "EDIT_TARGET_NOT_FOUND",
                f"EditTargetNotFound: edit {index}: target not found: {_preview(target)}",
                edit_index=index,
            )
        if edit.occurrence is None and len(starts) > 1:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "EDIT_TARGET_AMBIGUOUS",
                f"EditTargetAmbiguous: edit {index}: target found {len(starts)} times; give 'occurrence' "
                f"or a longer target: {_preview(target)}",
                edit_index=index,
                count=len(starts),
            )
        occurrence = edit.occurrence or 1
        if occurrence > len(starts):
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "EDIT_TARGET_NOT_FOUND",
                f"EditTargetNotFound: edit {index}: occurrence {occurrence} asked, target found {len(starts)} times",
                edit_index=index,
                count=len(starts),
            )
        at = starts[occurrence - 1]
        text = text[:at] + replacement + text[at + len(target) :]
    return text


def _find_all(text: str, target: str) -> list[int]:
    """Start offsets of non-overlapping matches, leftmost first."""
    found: list[int] = []
    at = text.find(target)
    while at >= 0:
        found.append(at)
        at = text.find(target, at + len(target))
    return found


def _preview(text: str) -> str:
    line = text.replace("\n", "⏎")
    return repr(line if len(line) <= 80 else line[:77] + "...")


class EditFile(Tool[EditFileArgs]):
    name = "edit_file"
    aliases = ("edit",)
    description = (
        "Edit a file with exact text replacements [{target, replacement, occurrence?}], applied in order. "
        "Each target must match exactly once unless occurrence is given. All edits apply or none do. "
        "The file must have been read with read_file in this session and not changed since."
    )
    args_type = EditFileArgs
    side_effecting = True
    risk = "medium"
    data_type = EditFileData
    output = "data: {changes: {path: modified}}"

    def validate(self, args: EditFileArgs) -> None:
        for index, edit in enumerate(args.edits):
            if edit.target == edit.replacement:
                raise bad_args(f"edit {index}: target and replacement are the same")

    def paths(self, args: EditFileArgs) -> list[str]:
        return [args.path]

    def summary(self, args: EditFileArgs) -> str:
        return f"Edit {args.path[:150]} ({len(args.edits)} edit{'s' if len(args.edits) != 1 else ''})"

    def changes(self, args: EditFileArgs, ctx: ToolContext) -> list[Path]:
        return [ctx.resolve(args.path)]

    def preview(self, args: EditFileArgs, ctx: ToolContext) -> str | None:
        path = ctx.resolve(args.path)
        with parent_dir(ctx.sandbox, path, shown=args.path) as (dir_fd, name):
            existing = read_existing(dir_fd, name, shown=args.path, sandbox=ctx.sandbox)
        if existing is None:
            return None
        before = decode(existing.data, args.path)
        return unified_diff(before.body, apply_edits(before.body, args.edits), args.path)

    def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolOutput:
        path = ctx.resolve(args.path)
        with parent_dir(ctx.sandbox, path, shown=args.path) as (dir_fd, name):
            existing = read_existing(dir_fd, name, shown=args.path, sandbox=ctx.sandbox)
            if existing is None:
                raise ToolError(ToolErrorType.FILE_NOT_FOUND, "FILE_NOT_FOUND", f"File not found: {args.path}")
            check_fresh(ctx, path, existing.data, dir_fd=dir_fd, name=name, shown=args.path)
            before: Text = decode(existing.data, args.path)
            after = before.with_body(apply_edits(before.body, args.edits))
            data = after.encode()
            atomic_write(dir_fd, name, data, mode=for_new_contents(existing.mode), shown=args.path)
        diff = unified_diff(before.body, after.body, args.path)
        return ToolOutput(
            f"Edited {args.path}: {len(args.edits)} edit(s) applied\n{diff}",
            diff or f"{args.path}: no change",
            {"changes": {args.path: "modified"}},
            records=written(path, data),
        )
