"""delete_file: a file, a symlink (never its target) or, with recursive, a directory."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..sandbox.writes import delete, parent_dir
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._mutate import gone


class DeleteFileArgs(ToolArgs, frozen=True):
    """Delete a file or directory."""

    path: Annotated[str, Meta(description="Path relative to the workspace root")]
    recursive: Annotated[bool, Meta(description="Required to delete a directory and its contents")] = False


class DeleteFile(Tool[DeleteFileArgs]):
    name = "delete_file"
    description = (
        "Delete a file in the workspace; a directory only with recursive=true. A sandbox root itself cannot be "
        "deleted. Returns the deleted paths."
    )
    args_type = DeleteFileArgs
    side_effecting = True
    follows_last_symlink = False
    risk = "high"
    output = "data: {changes: {path: deleted}, deleted: [path]}"

    def paths(self, args: DeleteFileArgs) -> list[str]:
        return [args.path]

    def summary(self, args: DeleteFileArgs) -> str:
        return f"Delete {args.path[:150]}{' recursively' if args.recursive else ''}"

    def run(self, args: DeleteFileArgs, ctx: ToolContext) -> ToolOutput:
        path = ctx.resolve(args.path, follow_last=False)
        with parent_dir(ctx.sandbox, path, shown=args.path) as (dir_fd, name):
            deleted = delete(dir_fd, name, recursive=args.recursive, shown=args.path, prefix=args.path.rstrip("/"))
        listing = "\n".join(deleted)
        return ToolOutput(
            f"Deleted {len(deleted)} path(s):\n{listing}",
            f"deleted {args.path} ({len(deleted)} path(s))",
            {"changes": dict.fromkeys(deleted, "deleted"), "deleted": deleted},
            records=gone(path),
        )
