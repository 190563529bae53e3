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


class UnreadableResponse(ValueError):
    """What was passed as a provider's response is none of the shapes the adapter reads
    (a response, its message or content, in dict form or as the SDK's own object): an
    error, not an empty list of calls that would end the turn silently."""


def plain(value: Any) -> Any:
    """A provider SDK's object as the dicts and lists its API sends: pydantic models
    (``model_dump``, as the OpenAI, Anthropic, Ollama and Google SDKs build them) and
    objects with ``to_dict``; plain values pass through, lists item by item."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, Mapping):
        return to_dict()
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def readable(response: Any, adapter: str, *, keys: tuple[str, ...]) -> Any:
    """``response`` in plain form, if it has one of ``keys`` (or is a list, where the
    adapter reads lists); else ``UnreadableResponse`` naming what was expected."""
    response = plain(response)
    if isinstance(response, Mapping) and any(key in response for key in keys):
        return response
    if isinstance(response, list) and "list" in keys:
        return response
    shape = f"a dict with keys {sorted(response)[:8]}" if isinstance(response, Mapping) else type(response).__name__
    expected = ", ".join(f"'{key}'" for key in keys if key != "list")
    raise UnreadableResponse(
        f"{adapter}: cannot read tool calls from {shape}; expected the provider's response or message "
        f"(a dict or the SDK's object with {expected})"
    )


def either(value: Mapping[str, Any], camel: str, snake: str) -> Any:
    """A field in either spelling: the REST API's camelCase or the SDKs' snake_case."""
    found = value.get(camel)
    return found if found is not None else value.get(snake)


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
