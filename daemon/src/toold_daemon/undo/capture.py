"""Run a mutating tool with its pre-images taken first and its post-images after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ..errors import ToolError, from_os_error
from ..tools._base import Tool, ToolContext, ToolOutput
from .images import Change, capture, changes_after, remembering_digests


def run_capturing(tool: Tool[Any], args: Any, ctx: ToolContext) -> ToolOutput:
    """``tool.run``, and when the daemon asked for undo data (``ctx.undo_budget`` ≥ 0)
    what it did to each path it declares. A call that fails after changing some of them
    (a recursive delete stopped by a directory it may not empty, a disk error) raises
    its error with those changes (``ToolError.changes``): what it did stays undoable."""
    if not tool.side_effecting:
        return tool.run(args, ctx)  # (changes nothing: no pre-image, no hash to remember)
    with remembering_digests():
        return _run_capturing(tool, args, ctx)


def _run_capturing(tool: Tool[Any], args: Any, ctx: ToolContext) -> ToolOutput:
    if ctx.undo_budget < 0:
        return tool.run(args, ctx)
    paths = tool.changes(args, ctx)
    if not paths:
        return tool.run(args, ctx)
    sandbox = ctx.sandbox

    def denied(path: str) -> bool:
        return sandbox.denied_pattern(Path(path)) is not None

    before, _used = capture(paths, ctx.undo_budget, denied, tool.moves(args, ctx))
    try:
        output = tool.run(args, ctx)
    except (ToolError, OSError) as exc:
        # Only what it changed: what it left as it found it (the file a recursive delete
        # stopped at) is not the undo's to put back.
        changes = [change for change in changes_after(before) if _changed(change)]
        if not changes:
            raise  # (most failures: refused before anything was touched)
        error = exc if isinstance(exc, ToolError) else from_os_error(exc, str(exc.filename or tool.name))
        error.changes = changes
        if error is exc:
            raise
        raise error from None
    return msgspec.structs.replace(output, changes=changes_after(before))


def _changed(change: Change) -> bool:
    if change.before.kind == change.after_kind == "dir":
        return False  # (a pre-image holds no tree hash: what changed below has its own change)
    if change.before.kind == "unknown":
        # Not taken (past the undo bound, unreadable, denied): all that is known is that
        # it was there. Gone, the call changed it; still there, nothing says it did (a
        # refused undo said it had changed every large file it only looked at).
        return change.after_kind == "absent"
    return change.after_kind != change.before.kind or change.after_hash != change.before.hash
