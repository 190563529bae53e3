"""Tool definitions as each model provider declares functions: one place for the
daemon's ``list_tools`` formats and the client's provider adapters."""

from __future__ import annotations

from typing import Any

from ._messages import ToolDefinition

#: Keywords Gemini's OpenAPI-subset schemas reject.
_GEMINI_DROP = {"title", "additionalProperties", "default", "$schema"}


def declaration(fmt: str, definition: ToolDefinition) -> dict[str, Any]:
    """One tool declared the way ``fmt`` (openai, anthropic, gemini, ollama, responses) expects."""
    name, description, schema = definition.name, definition.description, definition.parameters
    if fmt in ("openai", "ollama"):
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    if fmt == "responses":
        return {"type": "function", "name": name, "description": description, "parameters": schema}
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    if fmt == "gemini":
        return {"name": name, "description": description, "parameters": gemini_schema(schema)}
    raise ValueError(f"unknown tool format {fmt!r}")


def gemini_schema(node: Any) -> Any:
    """Gemini accepts an OpenAPI subset: drop the keywords it rejects (never a property's name)."""
    if isinstance(node, list):
        return [gemini_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _GEMINI_DROP:
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {prop: gemini_schema(sub) for prop, sub in value.items()}
        else:
            out[key] = gemini_schema(value)
    return out
