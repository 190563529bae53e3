"""OpenAI: Chat Completions (``tools``/``calls``/``results``) and the Responses API
(``response_tools``/``response_calls``/``response_results``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._common import Definitions, Results, answers, batch_call, declarations, decode_arguments, nth_id


def tools(definitions: Definitions) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]``."""
    return declarations("openai", definitions)


def calls(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool calls of a Chat Completions response (or of its first choice's message,
    or of an assistant message), in order. Arguments arrive as JSON text and are decoded."""
    message = response
    if "choices" in response:
        choices = response.get("choices") or [{}]
        message = choices[0].get("message") or {}
    out = []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        out.append(
            batch_call(
                nth_id(call.get("id"), index),
                str(function.get("name", "")),
                decode_arguments(function.get("arguments")),
            )
        )
    return out


def results(outcome: Results) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "tool_call_id", "content"}`` message per call, in call order."""
    return [{"role": "tool", "tool_call_id": a.call_id, "content": a.text} for a in answers(outcome)]


def response_tools(definitions: Definitions) -> list[dict[str, Any]]:
    """Responses API declarations: ``{"type": "function", name, description, parameters}``."""
    return declarations("responses", definitions)


def response_calls(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``function_call`` items of a Responses API ``output``, in order (``call_id`` kept)."""
    out = []
    items = [item for item in response.get("output") or [] if item.get("type") == "function_call"]
    for index, item in enumerate(items):
        out.append(
            batch_call(
                nth_id(item.get("call_id"), index), str(item.get("name", "")), decode_arguments(item.get("arguments"))
            )
        )
    return out


def response_results(outcome: Results) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per call, in call order."""
    return [{"type": "function_call_output", "call_id": a.call_id, "output": a.text} for a in answers(outcome)]
