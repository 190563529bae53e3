"""Google Gemini: ``functionCall`` parts in, ``functionResponse`` parts out.

Gemini's calls may come without ids; they get ``call_<n>`` by position, stable across
resubmission. A ``functionResponse`` names its function, so ``results`` needs the
names: pass the ``BatchOutcome`` (or result dicts with a ``name``)."""

from __future__ import annotations

from typing import Any

from ._common import (
    Definitions,
    Results,
    answers,
    batch_call,
    declarations,
    either,
    first,
    items,
    mapping,
    nth_id,
    readable,
)


def tools(definitions: Definitions) -> list[dict[str, Any]]:
    """``[{"functionDeclarations": [...]}]``, schemas reduced to the subset Gemini accepts."""
    return [{"functionDeclarations": declarations("gemini", definitions)}]


def calls(response: Any) -> list[dict[str, Any]]:
    """The ``functionCall`` parts of the first candidate (or of a ``content``), in order:
    the REST API's camelCase dicts, the SDK's snake_case ones (``model_dump``,
    ``to_json_dict``) or the SDK's ``GenerateContentResponse`` itself."""
    content = readable(response, "gemini.calls", keys=("candidates", "parts"))
    if "candidates" in content:
        content = mapping(first(content.get("candidates")).get("content"))
    parts = [mapping(either(mapping(part), "functionCall", "function_call")) for part in items(content.get("parts"))]
    function_parts = [call for call in parts if call]
    return [
        batch_call(nth_id(call.get("id"), index), call.get("name"), call.get("args", {}))
        for index, call in enumerate(function_parts)
    ]


def results(outcome: Results) -> list[dict[str, Any]]:
    """One ``user`` content whose ``functionResponse`` parts follow the calls' order."""
    parts = []
    for a in answers(outcome):
        if not a.name:
            raise ValueError("Gemini function responses name their function: pass the BatchOutcome")
        response: dict[str, Any] = {"output": a.text} if a.ok else {"error": a.text}
        if a.data:
            response["data"] = a.data
        parts.append({"functionResponse": {"id": a.call_id, "name": a.name, "response": response}})
    return [{"role": "user", "parts": parts}] if parts else []
