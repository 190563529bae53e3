"""Ollama chat API: OpenAI-like declarations, calls whose arguments are already objects."""

from __future__ import annotations

from typing import Any

from ._common import Definitions, Results, answers, declarations, function_calls, mapping, readable


def tools(definitions: Definitions) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]``."""
    return declarations("ollama", definitions)


def calls(response: Any) -> list[dict[str, Any]]:
    """The ``tool_calls`` of a chat response's ``message`` (or of a message; dicts or the
    SDK's objects), in order."""
    plain_response = readable(response, "ollama.calls", keys=("message", "tool_calls", "role", "content"))
    return function_calls(mapping(plain_response.get("message", plain_response)))


def results(outcome: Results) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "content", "tool_name"}`` message per call, in call order."""
    out = []
    for a in answers(outcome):
        message = {"role": "tool", "content": a.text}
        if a.name:
            message["tool_name"] = a.name
        out.append(message)
    return out
