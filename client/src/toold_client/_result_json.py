"""A tool result as ``toolctl --json`` prints it."""

from __future__ import annotations

from typing import Any

from toold_protocol import ToolResult


def result_json(result: ToolResult) -> dict[str, Any]:
    """The ``--json`` shape: exactly these keys, ``error`` null on success."""
    error = (
        None
        if result.error is None
        else {
            "type": result.error.type,
            "code": result.error.code,
            "message": result.error.message,
            "details": result.error.details,
        }
    )
    return {
        "call_id": result.call_id,
        "ok": result.ok,
        "content": result.content,
        "display": result.display,
        "error": error,
        "truncated": result.truncated,
        "duration_ms": result.duration_ms,
        "data": result.data,
    }
