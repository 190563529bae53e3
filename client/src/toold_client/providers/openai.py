"""OpenAI: Chat Completions (``tools``/``calls``/``results``) and the Responses API
(``response_tools``/``response_calls``/``response_results``)."""

from __future__ import annotations

from typing import Any

from ._common import (
    Definitions,
    Results,
    answers,
    batch_call,
    declarations,
    decode_arguments,
    first,
    function_calls,
    items,
    mapping,
    nth_id,
    readable,
)


def tools(definitions: Definitions) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]``."""
    return declarations("openai", definitions)


def calls(response: Any) -> list[dict[str, Any]]:
    """The tool calls of a Chat Completions response (or of its first choice's message,
    or of an assistant message; dicts or the SDK's objects), in order. Arguments arrive
    as JSON text and are decoded."""
    message = readable(response, "openai.calls", keys=("choices", "tool_calls", "role", "content"))
    if "choices" in message:
        message = mapping(first(message.get("choices")).get("message"))
    return function_calls(message)


def results(outcome: Results) -> list[dict[str, Any]]:
    """One ``{"role": "tool", "tool_call_id", "content"}`` message per call, in call order."""
    return [{"role": "tool", "tool_call_id": a.call_id, "content": a.text} for a in answers(outcome)]


def response_tools(definitions: Definitions) -> list[dict[str, Any]]:
    """Responses API declarations: ``{"type": "function", name, description, parameters, strict}``
    (``strict`` false: toold's schemas keep optional parameters optional)."""
    return declarations("responses", definitions)


def response_calls(response: Any) -> list[dict[str, Any]]:
    """The ``function_call`` items of a Responses API ``output`` (a dict or the SDK's
    ``Response``), in order (``call_id`` kept)."""
    found = [mapping(item) for item in items(readable(response, "openai.response_calls", keys=("output",))["output"])]
    function_items = [item for item in found if item.get("type") == "function_call"]
    return [
        batch_call(nth_id(item.get("call_id"), index), item.get("name"), decode_arguments(item.get("arguments")))
        for index, item in enumerate(function_items)
    ]


def response_results(outcome: Results) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per call, in call order."""
    return [{"type": "function_call_output", "call_id": a.call_id, "output": a.text} for a in answers(outcome)]
