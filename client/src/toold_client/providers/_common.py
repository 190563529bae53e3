"""What every provider adapter shares: reading definitions and results, and call ids."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from toold_protocol import ToolDefinition, ToolResult, declaration

from .._client import BatchOutcome
from .._requests import json_or_text

Definitions = Iterable[ToolDefinition | Mapping[str, Any]]
Results = BatchOutcome | Sequence[ToolResult | Mapping[str, Any]]


def declarations(fmt: str, definitions: Definitions) -> list[dict[str, Any]]:
    """Definitions (``ToolDefinition``s or their dict form) declared in ``fmt``."""
    out = []
    for item in definitions:
        definition = item if isinstance(item, ToolDefinition) else msgspec.convert(item, ToolDefinition)
        out.append(declaration(fmt, definition))
    return out


def decode_arguments(arguments: Any) -> Any:
    """A provider's JSON-string arguments as an object; a malformed string stays a string,
    which the daemon answers with a BadArgs result for that call (no exception here)."""
    if isinstance(arguments, str):
        return json_or_text(arguments)
    return arguments if arguments is not None else {}


#: Stands for a call's name when the model gave none usable: no tool has it, so that call
#: (and only that call) gets an UnknownTool result instead of the batch being refused.
NO_NAME = "<no tool name>"
_MAX_NAME = 128  # the protocol's limit; no tool name comes near it


def batch_call(call_id: str, name: Any, arguments: Any) -> dict[str, Any]:
    usable = isinstance(name, str) and name
    return {"id": call_id, "name": name[:_MAX_NAME] if usable else NO_NAME, "arguments": arguments}


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is an object, else an empty one: a provider response is untrusted
    input (the model shapes much of it), and a wrong shape must not raise here."""
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def first(value: Any) -> Mapping[str, Any]:
    """The first element of a list (``choices``, ``candidates``) as an object."""
    listed = items(value)
    return mapping(listed[0]) if listed else {}


def function_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``tool_calls`` of an OpenAI-shaped message (Chat Completions, Ollama), in order:
    ``{"id", "function": {"name", "arguments"}}``; arguments as JSON text or an object."""
    out = []
    for index, call in enumerate(items(message.get("tool_calls"))):
        function = mapping(mapping(call).get("function"))
        arguments = decode_arguments(function.get("arguments"))
        out.append(batch_call(nth_id(mapping(call).get("id"), index), function.get("name"), arguments))
    return out


def nth_id(call_id: Any, index: int) -> str:
    """The provider's id, or a stable ``call_<n>`` (position in the response) when it has none."""
    return call_id if isinstance(call_id, str) and call_id else f"call_{index}"


@dataclass(frozen=True, slots=True)
class Answer:
    """One call's result as the adapters need it."""

    call_id: str
    name: str
    ok: bool
    text: str
    data: dict[str, Any] | None


def answers(results: Results) -> list[Answer]:
    """The results in call order, each with its tool's name when the outcome knows it."""
    if isinstance(results, BatchOutcome):
        names = {planned.call_id: planned.name for planned in results.accepted.calls}
        items: Sequence[ToolResult | Mapping[str, Any]] = results.results
    else:
        names = {}
        items = results
    out = []
    for item in items:
        result = item if isinstance(item, ToolResult) else msgspec.convert(item, ToolResult)
        text = result.content or (result.error.message if result.error is not None else "")
        name = names.get(result.call_id, "") or (item.get("name", "") if isinstance(item, Mapping) else "")
        out.append(Answer(result.call_id, str(name), result.ok, text, result.data))
    return out
