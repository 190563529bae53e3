"""list_directory (alias ``ls``): structured entries, optionally recursive."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from msgspec import UNSET, Meta, UnsetType

from ..sandbox import Sandbox
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import ListDirectoryData
from ._walk import Walker, not_entered


class ListDirectoryArgs(ToolArgs, frozen=True):
    """List a directory inside the workspace."""

    path: Annotated[str, Meta(description="Directory relative to the workspace root")] = "."
    recursive: Annotated[bool, Meta(description="Include the contents of subdirectories")] = False
    max_depth: (
        Annotated[int, Meta(ge=1, le=64, description="With recursive: how many levels (1 = direct children)")]
        | UnsetType
    ) = UNSET
    include_hidden: Annotated[bool, Meta(description="Include entries whose names start with '.'")] = False
    max_entries: Annotated[int, Meta(ge=1, le=10_000, description="Stop after this many entries")] = 1000
    respect_gitignore: Annotated[bool, Meta(description="Skip what .gitignore files exclude")] = True


class ListDirectory(Tool[ListDirectoryArgs]):
    name = "list_directory"
    data_type = ListDirectoryData
    output = "data: {path, entries: [{name, path, type: file|dir|symlink|other, size, modified, target}], truncated}"
    aliases = ("ls",)
    description = (
        "List a directory in the workspace as JSON entries (name, path, type file/dir/symlink/other, size, "
        "modified). Symlinks are reported, not followed; .gitignore is respected."
    )
    args_type = ListDirectoryArgs

    def paths(self, args: ListDirectoryArgs) -> list[str]:
        return [args.path]

    def summary(self, args: ListDirectoryArgs) -> str:
        return f"List {args.path}{' recursively' if args.recursive else ''}"

    def run(self, args: ListDirectoryArgs, ctx: ToolContext) -> ToolOutput:
        sandbox = ctx.sandbox
        start = ctx.resolve(args.path)
        # Opened a name at a time, as the walk does (a directory deeper than PATH_MAX too):
        # a file is NOT_A_DIRECTORY, a missing path FILE_NOT_FOUND.
        os.close(sandbox.open_dir(start, display=args.path))
        depth = (args.max_depth if isinstance(args.max_depth, int) else None) if args.recursive else 1
        walker = Walker(
            sandbox, ctx, include_hidden=args.include_hidden, respect_gitignore=args.respect_gitignore, max_depth=depth
        )
        entries: list[dict[str, Any]] = []
        truncated = False
        for entry in walker.walk(start):
            if len(entries) >= args.max_entries:
                truncated = True
                break
            item: dict[str, Any] = {
                "name": entry.name,
                "path": sandbox.display(entry.path),
                "type": entry.kind,
                "size": entry.size,
                "modified": datetime.fromtimestamp(entry.mtime, tz=UTC).isoformat(),
            }
            if entry.kind == "symlink":
                item["target"] = _shown_target(sandbox, entry.path)
            entries.append(item)
        shown = sandbox.display(start)
        data = {"path": shown, "entries": entries, "truncated": truncated}
        lines = [
            f"{e['path']}{'/' if e['type'] == 'dir' else ''}"
            + (f" -> {e['target']}" if e["type"] == "symlink" else "")
            + (f"  ({e['size']} bytes)" if e["type"] == "file" else "")
            for e in entries
        ]
        if truncated:
            lines.append(f"[stopped at max_entries={args.max_entries}]")
        if walker.too_deep:
            lines.append(not_entered(walker.too_deep))
        return ToolOutput(json.dumps(data, ensure_ascii=False), "\n".join(lines), data)


def _shown_target(sandbox: Sandbox, link: Path) -> str | None:
    """Where a symlink points, as written, when that lies inside the workspace; a target
    outside (or denied) is not revealed, only that it is outside."""
    try:
        written = os.readlink(link)
        real = os.path.realpath(link)
    except (OSError, ValueError):
        return None
    inside = sandbox.root_of(Path(real)) is not None and sandbox.denied_pattern(Path(real)) is None
    return written if inside else "(outside the workspace)"
