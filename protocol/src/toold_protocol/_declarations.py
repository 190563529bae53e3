"""Tool definitions as each model provider declares functions: one place for the
daemon's ``list_tools`` formats and the client's provider adapters."""

from __future__ import annotations

from typing import Any

from ._messages import ToolDefinition

#: Schema keywords Gemini's function declarations accept (its OpenAPI subset, camelCase);
#: everything else is dropped or, where a near equivalent exists, translated.
_GEMINI_KEEP = {
    "type", "format", "description", "nullable", "enum", "items", "properties", "required", "anyOf",
    "minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "minProperties",
    "maxProperties", "pattern", "example", "propertyOrdering",
}  # fmt: skip


def declaration(fmt: str, definition: ToolDefinition) -> dict[str, Any]:
    """One tool declared the way ``fmt`` (openai, anthropic, gemini, ollama, responses) expects."""
    name, description, schema = definition.name, definition.description, definition.parameters
    if fmt in ("openai", "ollama"):
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}
    if fmt == "responses":
        # strict false: the SDK's types require the field; strict mode would need every
        # property required, and toold's optional parameters stay optional
        return {"type": "function", "name": name, "description": description, "parameters": schema, "strict": False}
    if fmt == "anthropic":
        return {"name": name, "description": description, "input_schema": schema}
    if fmt == "gemini":
        return {"name": name, "description": description, "parameters": gemini_schema(schema)}
    raise ValueError(f"unknown tool format {fmt!r}")


def gemini_schema(node: Any) -> Any:
    """A JSON Schema reduced to what Gemini accepts, at every depth (inside ``anyOf``,
    ``items`` and ``properties`` too): unknown keywords dropped (never a property's name),
    ``exclusiveMinimum``/``exclusiveMaximum`` as ``minimum``/``maximum`` (one step in for
    integers), ``const`` as a one-value ``enum`` (enums of strings only: Gemini's are), a ``null``
    alternative as ``nullable``."""
    if isinstance(node, list):
        return [gemini_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {prop: gemini_schema(sub) for prop, sub in value.items()}
        elif key in _GEMINI_KEEP:
            out[key] = gemini_schema(value)
    integer = node.get("type") == "integer"
    for exclusive, inclusive, step in (("exclusiveMinimum", "minimum", 1), ("exclusiveMaximum", "maximum", -1)):
        bound = node.get(exclusive)
        if isinstance(bound, (int, float)) and not isinstance(bound, bool) and inclusive not in out:
            out[inclusive] = bound + step if integer and isinstance(bound, int) else bound
    if "const" in node and "enum" not in out:
        out["enum"] = [node["const"]]
    if isinstance(out.get("enum"), list) and not all(isinstance(v, str) for v in out["enum"]):
        del out["enum"]  # Gemini's enums are of strings only
    alternatives = out.get("anyOf")
    if isinstance(alternatives, list) and any(_is_null(a) for a in alternatives):
        rest = [a for a in alternatives if not _is_null(a)]
        out["nullable"] = True
        if len(rest) == 1 and isinstance(rest[0], dict):
            del out["anyOf"]
            out = {**rest[0], **out}
        else:
            out["anyOf"] = rest
    return out


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"
