"""write_file: create a file, or replace one with overwrite=true. Atomic and symlink-safe."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..config import Config
from ..errors import ToolError, bad_args, file_exists
from ..sandbox.lookups import lexists
from ..sandbox.writes import atomic_write, for_new_contents, parent_dir, read_existing
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import WriteFileData
from ._mutate import written
from ._text import unified_diff


class WriteFileArgs(ToolArgs, frozen=True):
    """Write a whole file."""

    path: Annotated[str, Meta(description="File path relative to the workspace root")]
    content: Annotated[str, Meta(description="The complete new content")]
    encoding: Annotated[Literal["utf-8", "base64"], Meta(description="How content is encoded")] = "utf-8"
    overwrite: Annotated[bool, Meta(description="Replace an existing file (default: refuse)")] = False
    create_dirs: Annotated[bool, Meta(description="Create missing parent directories")] = True


class WriteFile(Tool[WriteFileArgs]):
    name = "write_file"
    description = (
        "Write a file in the workspace with the given content. Refuses to replace an existing file unless "
        "overwrite=true. The write is atomic; an existing file keeps its permissions."
    )
    args_type = WriteFileArgs
    side_effecting = True
    risk = "medium"
    data_type = WriteFileData
    output = "data: {changes: {path: created|modified}, bytes}"

    def validate(self, args: WriteFileArgs) -> None:
        if args.encoding == "base64":
            _decode_base64(args.content)

    def paths(self, args: WriteFileArgs) -> list[str]:
        return [args.path]

    def summary(self, args: WriteFileArgs) -> str:
        verb = "Overwrite" if args.overwrite else "Create"
        return f"{verb} {args.path[:150]} ({len(args.content)} chars)"

    def precheck(self, args: WriteFileArgs, resolved: dict[str, Path], config: Config) -> None:
        path = resolved.get(args.path)
        if not args.overwrite and path is not None and lexists(str(path)):
            raise file_exists(args.path)

    def prompts(self, args: WriteFileArgs, resolved: dict[str, Path], config: Config) -> bool:
        return args.overwrite  # creating a new file does not ask under the default policy

    def changes(self, args: WriteFileArgs, ctx: ToolContext) -> list[Path]:
        return [ctx.resolve(args.path)]

    def preview(self, args: WriteFileArgs, ctx: ToolContext) -> str | None:
        """The diff against the file as it is, or against nothing for a new file."""
        if args.encoding != "utf-8":
            return f"would write {args.path} ({len(_decode_base64(args.content))} bytes of binary content)"
        path = ctx.resolve(args.path)
        try:
            with parent_dir(ctx.sandbox, path, shown=args.path) as (dir_fd, name):
                existing = read_existing(dir_fd, name, shown=args.path, sandbox=ctx.sandbox, unread_past=True)
        except ToolError as exc:
            if exc.type != ToolErrorType.FILE_NOT_FOUND:  # a missing parent: created with the file
                raise
            existing = None
        if existing is not None and not args.overwrite:
            raise file_exists(args.path)
        if existing is not None and existing.unread:
            return f"would replace {args.path} ({existing.size} bytes, too large to show as a diff)"
        before = existing.data.decode("utf-8", errors="replace") if existing is not None else ""
        return unified_diff(before, args.content, args.path)

    def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolOutput:
        path = ctx.resolve(args.path)
        data = _decode_base64(args.content) if args.encoding == "base64" else args.content.encode("utf-8")
        with parent_dir(ctx.sandbox, path, create=args.create_dirs, shown=args.path) as (dir_fd, name):
            existing = read_existing(dir_fd, name, shown=args.path, sandbox=ctx.sandbox, unread_past=True)
            if existing is not None and not args.overwrite:
                raise file_exists(args.path)
            mode = for_new_contents(existing.mode) if existing else None
            atomic_write(dir_fd, name, data, mode=mode, shown=args.path)
        change = "modified" if existing is not None else "created"
        display = f"{change} {args.path} ({len(data)} bytes)"
        if existing is not None and existing.unread:
            display += f"; it held {existing.size} bytes, too large to show as a diff"
        elif existing is not None and args.encoding == "utf-8":
            diff = unified_diff(existing.data.decode("utf-8", errors="replace"), args.content, args.path)
            display += "\n" + diff if diff else " (no change)"
        return ToolOutput(
            f"{'Overwrote' if existing is not None else 'Created'} {args.path} ({len(data)} bytes)",
            display,
            {"changes": {args.path: change}, "bytes": len(data)},
            records=written(path, data),
        )


def _decode_base64(content: str) -> bytes:
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise bad_args("content is not valid base64") from None
