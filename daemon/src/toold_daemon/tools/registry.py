"""The tool registry: names to tools, definitions with JSON Schemas, provider exports.

Registering a taken name raises DuplicateTool unless ``replace=True``.
Listing is sorted by name. Schemas come from each tool's msgspec argument type, so
the schema the model sees and the validation the daemon applies cannot drift.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Any

import msgspec

from toold_protocol import ToolDefinition, ToolErrorType, declaration

from ..errors import ToolError
from ._base import Tool
from ._data import data_schema

AnyTool = Tool[Any]


class Registry:
    def __init__(self) -> None:
        self._tools: dict[str, AnyTool] = {}
        self._aliases: dict[str, str] = {}
        self._definitions: list[ToolDefinition] | None = None
        self._withheld: dict[str, str] = {}  # tools this daemon's configuration cannot offer: why
        self._unlisted: dict[str, dict[int, str]] = {}  # name prefix -> uid -> why not listed now

    def withhold(self, name: str, reason: str) -> None:
        """Do not offer ``name``; a call to it is refused with ``reason``."""
        self.unregister(name)
        self._withheld[name] = reason

    def why_withheld(self, name: str) -> str | None:
        return self._withheld.get(name)

    def note_unlisted(self, prefix: str, uid: int, reason: str) -> None:
        """The tools named ``prefix``... could not be listed for ``uid`` just now (an MCP
        server with no room for that user's instance): a call to one of them is refused
        with ``reason`` rather than as unknown, until ``forget_unlisted``."""
        self._unlisted.setdefault(prefix, {})[uid] = reason

    def forget_unlisted(self, prefix: str) -> None:
        self._unlisted.pop(prefix, None)

    def why_unlisted(self, name: str, uid: int) -> str | None:
        for prefix, reasons in self._unlisted.items():
            if name.startswith(prefix) and uid in reasons:
                return reasons[uid]
        return None

    def register(self, tool: AnyTool, *, replace: bool = False) -> None:
        if tool.name in self._tools and not replace:
            raise ToolError(
                ToolErrorType.DUPLICATE_TOOL,
                "DUPLICATE_TOOL",
                f"A tool named {tool.name!r} is already registered",
                name=tool.name,
            )
        self.unregister(tool.name)
        self._withheld.pop(tool.name, None)
        self._tools[tool.name] = tool
        for alias in tool.aliases:
            self._aliases[alias] = tool.name
        self._definitions = None

    def unregister(self, name: str) -> bool:
        tool = self._tools.pop(name, None)
        if tool is None:
            return False
        for alias in tool.aliases:
            if self._aliases.get(alias) == name:
                del self._aliases[alias]
        self._definitions = None
        return True

    def get(self, name: str) -> AnyTool | None:
        """Look up by name or by an accepted alias (``ls`` for ``list_directory``)."""
        tool = self._tools.get(name)
        if tool is None and name in self._aliases:
            tool = self._tools.get(self._aliases[name])
        return tool

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def list(self) -> builtins.list[AnyTool]:
        return [self._tools[name] for name in sorted(self._tools)]

    def definitions(self) -> builtins.list[ToolDefinition]:
        """Cached until the registry changes."""
        if self._definitions is None:
            self._definitions = [
                ToolDefinition(
                    name=tool.name,
                    description=tool.description,
                    parameters=tool.json_schema or parameters_schema(tool.args_type),
                    risk=tool.risk,
                    side_effecting=tool.side_effecting,
                    aliases=list(tool.aliases),
                    output=tool.output,
                    data_schema=data_schema(tool.data_type),
                    open_world=tool.network,
                )
                for tool in self.list()
                if not tool.internal
            ]
        return self._definitions

    def export(self, fmt: str, *, hidden: Collection[str] = ()) -> builtins.list[dict[str, Any]]:
        """The definitions (but ``hidden``) as one provider expects its function declarations."""
        out: builtins.list[dict[str, Any]] = []
        for d in self.definitions():
            if d.name not in hidden:
                out.append(msgspec.to_builtins(d) if fmt == "toold" else declaration(fmt, d))
        return out


def parameters_schema(args_type: type[Any]) -> dict[str, Any]:
    """A self-contained JSON Schema object (``$ref``s inlined: several providers reject them)."""
    schema = msgspec.json.schema(args_type)
    defs = schema.pop("$defs", {})
    inlined = _inline(schema, defs)
    assert isinstance(inlined, dict)
    inlined.pop("title", None)
    return inlined


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = dict(defs[ref.removeprefix("#/$defs/")])
            return _inline(target, defs)
        return {key: _inline(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node
