"""move_file: rename a file or directory inside the roots (copy + delete across filesystems)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from ..config import Config
from ..errors import bad_args, file_exists, file_not_found
from ..sandbox.lookups import lexists
from ..sandbox.writes import move, parent_dir
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import MoveFileData
from ._mutate import gone


class MoveFileArgs(ToolArgs, frozen=True):
    """Move or rename a file."""

    source: Annotated[str, Meta(description="Existing path relative to the workspace root")]
    destination: Annotated[str, Meta(description="New path relative to the workspace root")]
    overwrite: Annotated[bool, Meta(description="Replace an existing destination (default: refuse)")] = False


class MoveFile(Tool[MoveFileArgs]):
    name = "move_file"
    description = (
        "Move or rename a file or directory inside the workspace. Refuses to replace an existing destination "
        "unless overwrite=true."
    )
    args_type = MoveFileArgs
    side_effecting = True
    follows_last_symlink = False
    risk = "medium"
    data_type = MoveFileData
    output = "data: {changes: {source: deleted, destination: moved}}"

    def validate(self, args: MoveFileArgs) -> None:
        if args.source.rstrip("/") == args.destination.rstrip("/"):
            raise bad_args("source and destination are the same")

    def paths(self, args: MoveFileArgs) -> list[str]:
        return [args.source, args.destination]

    def summary(self, args: MoveFileArgs) -> str:
        return f"Move {args.source[:90]} to {args.destination[:90]}"

    def precheck(self, args: MoveFileArgs, resolved: dict[str, Path], config: Config) -> None:
        destination = resolved.get(args.destination)
        if not args.overwrite and destination is not None and lexists(str(destination)):
            raise file_exists(args.destination)

    def prompts(self, args: MoveFileArgs, resolved: dict[str, Path], config: Config) -> bool:
        destination = resolved.get(args.destination)
        return destination is None or lexists(str(destination))  # asks only when replacing

    def changes(self, args: MoveFileArgs, ctx: ToolContext) -> list[Path]:
        return [ctx.resolve(args.source, follow_last=False), ctx.resolve(args.destination, follow_last=False)]

    def moves(self, args: MoveFileArgs, ctx: ToolContext) -> dict[Path, Path]:
        source, destination = self.changes(args, ctx)
        return {source: destination}

    def preview(self, args: MoveFileArgs, ctx: ToolContext) -> str | None:
        source = ctx.resolve(args.source, follow_last=False)
        destination = ctx.resolve(args.destination, follow_last=False)
        if not os.path.lexists(source):
            raise file_not_found(args.source)
        replacing = os.path.lexists(destination)
        if replacing and not args.overwrite:
            raise file_exists(args.destination)
        return f"would move {args.source} to {args.destination}" + (" (replacing it)" if replacing else "")

    def run(self, args: MoveFileArgs, ctx: ToolContext) -> ToolOutput:
        source = ctx.resolve(args.source, follow_last=False)
        destination = ctx.resolve(args.destination, follow_last=False)
        if destination == source or str(destination).startswith(str(source).rstrip("/") + "/"):
            raise bad_args(f"cannot move {args.source} into itself ({args.destination})")
        with (
            parent_dir(ctx.sandbox, source, shown=args.source) as (src_fd, src_name),
            # a move that cannot happen must leave no trace: the source is looked for before
            # any directory is made for the destination
            _existing(src_fd, src_name, args.source),
            parent_dir(ctx.sandbox, destination, create=True, shown=args.destination) as (dst_fd, dst_name),
        ):
            move(
                src_fd,
                src_name,
                dst_fd,
                dst_name,
                overwrite=args.overwrite,
                shown_src=args.source,
                shown_dst=args.destination,
                sandbox=ctx.sandbox,
            )
        return ToolOutput(
            f"Moved {args.source} to {args.destination}",
            f"moved {args.source} → {args.destination}",
            {"changes": {args.source: "deleted", args.destination: "moved"}},
            records={**gone(source), **gone(destination)},
        )


@contextmanager
def _existing(dir_fd: int, name: str, shown: str) -> Iterator[None]:
    """Raise FileNotFound unless ``name`` is there (a symlink counts: it is what moves)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise file_not_found(shown) from None
    yield
