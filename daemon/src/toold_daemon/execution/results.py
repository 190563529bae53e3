"""Making ToolResults: every result, success or error, is built and bounded here."""

from __future__ import annotations

from typing import Any

from toold_protocol import ToolErrorInfo, ToolErrorType, ToolResult

from ..errors import ToolError
from ..output import NOTHING_UNSEEN, Unseen, sanitize_for_terminal, truncate

_MAX_ERROR_CHARS = 2000


#: Error details that carry a failed tool's output to ``failure``, not to the client.
OUTPUT_DETAILS = frozenset({"output", "output_tail", "unseen_bytes", "unseen_lines"})


def success(
    call_id: str,
    content: str,
    display: str | None,
    data: dict[str, Any] | None,
    *,
    allow_truncation: bool,
    max_bytes: int,
    max_lines: int,
    duration_ms: float,
    tail: str = "",
    unseen: Unseen = NOTHING_UNSEEN,
) -> ToolResult:
    truncated = False
    original = content
    if allow_truncation:
        cut = truncate(content, max_bytes=max_bytes, max_lines=max_lines, unseen=unseen, tail=tail)
        content, truncated = cut.text, cut.truncated
    else:  # the tool bounded its own output; what it left out is its ``unseen``
        truncated = bool(unseen)
        if tail:
            content = content + ("" if not content or content.endswith("\n") else "\n") + tail
    if display is None or display is original:
        shown, shown_truncated = content, truncated  # the same text: bound it once
    else:
        shown_cut = truncate(display, max_bytes=max_bytes, max_lines=max_lines)
        shown, shown_truncated = shown_cut.text, shown_cut.truncated
    cut_by_tool = isinstance(data, dict) and data.get("truncated") is True  # the tool cut its own content
    return ToolResult(
        call_id=call_id,
        ok=True,
        content=content,
        display=sanitize_for_terminal(shown),
        data=data,
        truncated=truncated or shown_truncated or cut_by_tool,
        duration_ms=round(duration_ms, 3),
    )


def failure(
    call_id: str,
    error: ToolError | ToolErrorInfo,
    *,
    duration_ms: float = 0.0,
    output: str = "",
    unseen: Unseen = NOTHING_UNSEEN,
    max_bytes: int = 102_400,
    max_lines: int = 10_000,
) -> ToolResult:
    """An error result: the error line, then the output (what a command printed before
    failing, or before its timeout), bounded by the same limits as a success, error line
    and exit code included: the model needs both."""
    info = error.info() if isinstance(error, ToolError) else error
    original = info.message
    message = truncate(original, max_chars=_MAX_ERROR_CHARS).text
    if len(message.encode()) > max_bytes // 2:  # the error line must leave room, and fit, in max_bytes
        message = truncate(message, max_bytes=max_bytes // 2, max_lines=max_lines).text
    details = dict(info.details)
    output = output or str(details.get("output") or "")
    tail = str(details.get("output_tail") or "")
    if not unseen and (details.get("unseen_bytes") or details.get("unseen_lines")):
        unseen = Unseen(int(details.get("unseen_bytes") or 0), int(details.get("unseen_lines") or 0))
    details = {k: v for k, v in details.items() if k not in OUTPUT_DETAILS}
    info = ToolErrorInfo(type=info.type, code=info.code, message=message, details=details)
    head = f"Error ({info.type}): {message}"
    if output or tail or unseen:
        cut = truncate(output, max_bytes=max_bytes, max_lines=max_lines, unseen=unseen, head=head + "\n\n", tail=tail)
        text, truncated = cut.text, cut.truncated
    else:
        text, truncated = head, message != original  # a cut message is a cut result
    if len(text.encode()) > max_bytes:  # a cut message plus its prefix, or a long head
        text, truncated = truncate(text, max_bytes=max_bytes, max_lines=max_lines).text, True
    return ToolResult(
        call_id=call_id,
        ok=False,
        content=text,
        display=sanitize_for_terminal(text),
        error=info,
        truncated=truncated,
        duration_ms=round(duration_ms, 3),
    )


def crashed(call_id: str, exc: BaseException, *, duration_ms: float) -> ToolResult:
    """An unexpected exception inside a tool: type and a sanitized, short message."""
    detail = sanitize_for_terminal(str(exc))[:300]
    message = f"Tool failed: {type(exc).__name__}" + (f": {detail}" if detail else "")
    return failure(call_id, ToolError(ToolErrorType.EXECUTION_FAILED, "TOOL_FAILED", message), duration_ms=duration_ms)
