"""Run a mutating tool with its pre-images taken first and its post-images after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ..tools._base import Tool, ToolContext, ToolOutput
from .images import capture, changes_after


def run_capturing(tool: Tool[Any], args: Any, ctx: ToolContext) -> ToolOutput:
    """``tool.run``, and when the daemon asked for undo data (``ctx.undo_budget`` ≥ 0)
    what it did to each path it declares. A call that fails records nothing: the tools
    change a path atomically or not at all."""
    if ctx.undo_budget < 0 or not tool.side_effecting:
        return tool.run(args, ctx)
    paths = tool.changes(args, ctx)
    if not paths:
        return tool.run(args, ctx)
    sandbox = ctx.sandbox
    before, _used = capture(paths, ctx.undo_budget, lambda p: sandbox.denied_pattern(Path(p)) is not None)
    output = tool.run(args, ctx)
    return msgspec.structs.replace(output, changes=changes_after(before))
