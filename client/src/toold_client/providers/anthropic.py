"""Anthropic Messages API: ``tool_use`` blocks in, one ``user`` message of ``tool_result`` blocks out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import Definitions, Results, answers, batch_call, declarations, items, mapping, nth_id, readable


def tools(definitions: Definitions) -> list[dict[str, Any]]:
    """``[{name, description, input_schema}]``."""
    return declarations("anthropic", definitions)


def calls(response: Any) -> list[dict[str, Any]]:
    """The ``tool_use`` blocks of a response (or of its ``content`` list; dicts or the
    SDK's objects), in order."""
    readable_response = readable(response, "anthropic.calls", keys=("content", "list"))
    blocks = items(readable_response.get("content")) if isinstance(readable_response, Mapping) else readable_response
    uses = [mapping(block) for block in blocks if mapping(block).get("type") == "tool_use"]
    return [
        batch_call(nth_id(block.get("id"), index), block.get("name"), block.get("input", {}))
        for index, block in enumerate(uses)
    ]


def results(outcome: Results) -> list[dict[str, Any]]:
    """A single ``user`` message whose ``tool_result`` blocks follow the calls' order."""
    blocks = [
        {"type": "tool_result", "tool_use_id": a.call_id, "content": a.text, "is_error": not a.ok}
        for a in answers(outcome)
    ]
    return [{"role": "user", "content": blocks}] if blocks else []
