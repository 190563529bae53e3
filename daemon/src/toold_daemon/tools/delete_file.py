"""delete_file: a file, a symlink (never its target) or, with recursive, a directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from ..config import Config
from ..errors import bad_args, file_not_found
from ..sandbox.lookups import open_path
from ..sandbox.trees import walk
from ..sandbox.writes import delete, parent_dir
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import DeleteFileData
from ._mutate import gone

PREVIEW_PATHS = 200


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
    data_type = DeleteFileData
    output = "data: {changes: {path: deleted}, deleted: [path]}"

    def paths(self, args: DeleteFileArgs) -> list[str]:
        return [args.path]

    def precheck(self, args: DeleteFileArgs, resolved: dict[str, Path], config: Config) -> None:
        """A file that is not there fails now, before anyone is asked to approve deleting it.
        Only a definite "no such file" counts: where the daemon may not look (another user's
        workspace), the tool decides when it runs."""
        path = resolved.get(args.path)
        if path is None:
            return
        try:
            os.close(open_path(str(path), os.O_NOFOLLOW))
        except FileNotFoundError:
            raise file_not_found(args.path) from None
        except OSError:
            return

    def summary(self, args: DeleteFileArgs) -> str:
        return f"Delete {args.path[:150]}{' recursively' if args.recursive else ''}"

    def changes(self, args: DeleteFileArgs, ctx: ToolContext) -> list[Path]:
        return [ctx.resolve(args.path, follow_last=False)]

    def preview(self, args: DeleteFileArgs, ctx: ToolContext) -> str | None:
        """The paths a delete would remove (a directory needs ``recursive``)."""
        path = ctx.resolve(args.path, follow_last=False)
        if not os.path.lexists(path):
            raise file_not_found(args.path)
        if not os.path.isdir(path) or os.path.islink(path):
            return f"would delete {args.path}"
        if not args.recursive:
            raise bad_args(f"{args.path} is a directory: deleting it needs recursive=true")
        found = [args.path.rstrip("/") + "/"]
        hidden = 0  # denied entries are counted, never named: a dry run must not list secrets
        for directory, dirs, files in walk(path):
            dirs.sort()
            for name in sorted(files) + dirs:
                full = os.path.join(directory, name)
                if ctx.sandbox.denied_pattern(Path(full)) is not None:
                    hidden += 1
                    continue
                found.append(os.path.relpath(full, path.parent))
                if len(found) > PREVIEW_PATHS:
                    return "would delete:\n" + "\n".join(found) + "\n… and more"
        also = f"\nand {hidden} denied entr{'y' if hidden == 1 else 'ies'}" if hidden else ""
        return "would delete:\n" + "\n".join(found) + also

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
