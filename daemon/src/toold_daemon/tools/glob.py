"""glob: files whose path matches a pattern, sorted, .gitignore respected."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..errors import ToolError, bad_args
from ..globmatch import GlobTooComplex, compile_glob, expand_braces, literal_prefix
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import GlobData
from ._walk import Walker, not_entered


class GlobArgs(ToolArgs, frozen=True):
    """Find files by glob pattern."""

    pattern: Annotated[
        str,
        Meta(min_length=1, max_length=1024, description="Glob such as **/*.py or src/*.{ts,tsx}; ** spans directories"),
    ]
    path: Annotated[str, Meta(description="Directory to search, relative to the workspace root")] = "."
    max_results: Annotated[int, Meta(ge=1, le=10_000, description="Return at most this many paths")] = 500
    include_hidden: Annotated[bool, Meta(description="Include files and directories starting with '.'")] = False
    respect_gitignore: Annotated[bool, Meta(description="Skip what .gitignore files exclude")] = True
    case_sensitive: bool = True


class Glob(Tool[GlobArgs]):
    name = "glob"
    data_type = GlobData
    output = "data: {matches: [path], count, truncated}"
    description = (
        "Find files whose path (relative to `path`) matches a glob pattern. Results are sorted workspace-relative "
        "paths; .gitignore is respected and .git is never listed."
    )
    args_type = GlobArgs

    def validate(self, args: GlobArgs) -> None:
        if args.pattern.startswith("/") or ".." in args.pattern.split("/"):
            raise bad_args("pattern must be relative and must not contain '..'")
        try:  # expanding is cheap; compiling is the worker's (validate runs in the daemon)
            expand_braces(args.pattern)
        except GlobTooComplex as exc:
            raise bad_args(str(exc)) from None

    def paths(self, args: GlobArgs) -> list[str]:
        return [args.path]

    def summary(self, args: GlobArgs) -> str:
        return f"Find files matching {args.pattern} in {args.path}"

    def run(self, args: GlobArgs, ctx: ToolContext) -> ToolOutput:
        sandbox = ctx.sandbox
        base = ctx.resolve(args.path)
        if not base.is_dir():
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "NOT_A_DIRECTORY", f"{args.path} is not a directory")
        prefix = literal_prefix(args.pattern)
        start = base
        if prefix:
            try:
                start = sandbox.resolve(prefix, base=base)
            except ToolError:
                start = base
            if not start.is_dir():
                return _result([], False, args)
        regex = compile_glob(args.pattern, case_sensitive=args.case_sensitive)
        depth = None if "**" in args.pattern else args.pattern.count("/") + 1 - (prefix.count("/") + 1 if prefix else 0)
        walker = Walker(
            sandbox, ctx, include_hidden=args.include_hidden, respect_gitignore=args.respect_gitignore, max_depth=depth
        )
        offset = len(prefix) + 1 if prefix and start != base else 0
        matches: list[str] = []
        truncated = False
        for entry in walker.walk(start):
            if entry.kind == "dir":
                continue
            rel = (prefix + "/" + entry.rel) if offset else entry.rel
            if regex.match(rel):
                if len(matches) >= args.max_results:
                    truncated = True
                    break
                matches.append(sandbox.display(entry.path))
        return _result(matches, truncated, args, walker.too_deep)


def _result(matches: list[str], truncated: bool, args: GlobArgs, too_deep: int = 0) -> ToolOutput:
    data = {"matches": matches, "count": len(matches), "truncated": truncated}
    text = "\n".join(matches) if matches else f"No files match {args.pattern}"
    if truncated:
        text += f"\n[stopped at max_results={args.max_results}]"
    if too_deep:
        text += f"\n{not_entered(too_deep)}"
    return ToolOutput(text, text, data)
