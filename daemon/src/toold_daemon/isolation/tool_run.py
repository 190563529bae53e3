"""One Python tool call (or its preview) in a confined child: a worker's call, or a child
of its own. Its chunks go to the channel as it runs; the outcome is returned."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ..errors import ToolError, from_os_error
from ..sandbox import Sandbox
from ..tools._base import ToolContext, ToolOutput
from ..undo.capture import run_capturing
from .prepare import Work
from .wire import Chunk, Outcome, SpawnRequest, failure, write_frame


def run_tool(request: SpawnRequest, channel: int, work: Work) -> Outcome:
    """Run (or preview) one Python tool call; its chunks go to ``channel`` as it runs."""
    tool, args, config, sandbox = work.tool, work.args, work.config, work.sandbox
    if tool is None or config is None:
        return failure("UnknownTool", "UNKNOWN_TOOL", f"the spawner does not know {request.tool!r}")
    if not isinstance(sandbox, Sandbox):
        return failure("PermissionDenied", "ROOT_UNREACHABLE", f"the workspace is not reachable: {sandbox}")
    ctx = ToolContext(
        call_id=request.call_id,
        sandbox=sandbox,
        config=config,
        resolved={k: Path(v) for k, v in request.resolved.items()},
        reads=dict(request.reads),
        emit=lambda stream, data: write_frame(channel, Chunk(stream=stream, data=data)),
        undo_budget=request.undo_budget,
        blobs=dict(request.blobs),
    )
    try:
        if request.preview:
            return Outcome(ok=True, content=tool.preview(args, ctx) or "")
        output: ToolOutput = run_capturing(tool, args, ctx)
    except ToolError as exc:
        details = dict(exc.details)
        read = details.pop("output", None)  # what the tool read before failing (an HTTP error's body)
        failed = failure(str(exc.type), exc.code, exc.message, **details)
        if exc.changes:  # what it changed before it failed, for undo
            failed = msgspec.structs.replace(failed, changes=exc.changes)
        return msgspec.structs.replace(failed, content=read) if isinstance(read, str) else failed
    except OSError as exc:
        translated = from_os_error(exc, str(exc.filename or request.tool))
        return failure(str(translated.type), translated.code, translated.message, **translated.details)
    return Outcome(
        ok=True,
        content=output.content,
        display=None if output.display == output.content else output.display,  # not sent twice
        data=output.data,
        allow_truncation=output.allow_truncation,
        records=output.records,
        tail=output.tail,
        unseen_bytes=output.unseen.bytes,
        unseen_lines=output.unseen.lines,
        changes=output.changes,
    )
