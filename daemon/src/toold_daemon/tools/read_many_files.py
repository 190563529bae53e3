"""read_many_files: several files (paths or glob patterns) with a header per file."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from ..errors import ToolError
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import ReadManyFilesData
from .glob import Glob, GlobArgs
from .read_file import ReadFile, ReadFileArgs

_GLOB_CHARS = frozenset("*?[{")


class ReadManyFilesArgs(ToolArgs, frozen=True):
    """Read several files at once."""

    paths: Annotated[
        list[Annotated[str, Meta(min_length=1)]],
        Meta(min_length=1, max_length=100, description="File paths or glob patterns, relative to the workspace root"),
    ]
    max_files: Annotated[int, Meta(ge=1, le=500, description="Read at most this many files")] = 50


class ReadManyFiles(Tool[ReadManyFilesArgs]):
    name = "read_many_files"
    data_type = ReadManyFilesData
    output = "data: {files: [{path, ok, size} | {path, ok: false, error, message}], skipped}"
    description = (
        "Read several files (paths or glob patterns such as src/**/*.py). Output has a '--- path ---' header "
        "per file; a file that cannot be read gets its error under its header without failing the call."
    )
    args_type = ReadManyFilesArgs

    def paths(self, args: ReadManyFilesArgs) -> list[str]:
        return [p for p in args.paths if not _GLOB_CHARS.intersection(p)]

    def locations(self, args: ReadManyFilesArgs) -> list[str]:
        return list(args.paths)

    def summary(self, args: ReadManyFilesArgs) -> str:
        shown = ", ".join(args.paths[:5]) + (f" and {len(args.paths) - 5} more" if len(args.paths) > 5 else "")
        return f"Read {shown}"

    def run(self, args: ReadManyFilesArgs, ctx: ToolContext) -> ToolOutput:
        names = self._expand(args, ctx)
        reader = ReadFile()
        sections: list[str] = []
        files: list[dict[str, Any]] = []
        for name in names[: args.max_files]:
            ctx.check_cancelled()
            try:
                out = reader.run(ReadFileArgs(path=name), ctx)
                sections.append(f"--- {name} ---\n{out.content}")
                files.append({"path": name, "ok": True, "size": (out.data or {}).get("size")})
            except ToolError as exc:
                sections.append(f"--- {name} ---\n[error {exc.code}: {exc.message}]")
                files.append({"path": name, "ok": False, "error": exc.info().code, "message": exc.message})
        skipped = max(0, len(names) - args.max_files)
        if skipped:
            sections.append(f"[{skipped} more files not read: max_files={args.max_files}]")
        text = "\n\n".join(sections) if sections else "No files matched"
        return ToolOutput(text, text, {"files": files, "skipped": skipped})

    def _expand(self, args: ReadManyFilesArgs, ctx: ToolContext) -> list[str]:
        """Paths in the order given; each glob expands to its sorted matches. Duplicates dropped."""
        seen: dict[str, None] = {}
        finder = Glob()
        for item in args.paths:
            if _GLOB_CHARS.intersection(item):
                try:
                    found = finder.run(GlobArgs(pattern=item, max_results=args.max_files + 1), ctx)
                except ToolError:
                    continue
                for match in (found.data or {}).get("matches", []):
                    seen.setdefault(match, None)
            else:
                seen.setdefault(item, None)
        return list(seen)
