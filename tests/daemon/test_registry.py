"""Registry: registration, lookup, listing; duplicates rejected unless replace=True."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.errors import ToolError
from toold_daemon.tools import Tool, ToolArgs, ToolContext, ToolOutput
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.registry import Registry


class EchoArgs(ToolArgs, frozen=True):
    """Echo something back."""

    text: str
    times: int = 1


def make_tool(tool_name: str, desc: str = "echo") -> Tool[Any]:
    class Echo(Tool[EchoArgs]):
        name: ClassVar[str] = tool_name
        description: ClassVar[str] = desc
        args_type = EchoArgs

        def run(self, args: EchoArgs, ctx: ToolContext) -> ToolOutput:
            return ToolOutput(args.text * args.times)

    return Echo()


tool_names = st.lists(st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True), unique=True, max_size=12)


@given(tool_names)
def test_property_1_register_and_get(names: list[str]) -> None:
    registry = Registry()
    tools = {name: make_tool(name) for name in names}
    for tool in tools.values():
        registry.register(tool)
    for name, tool in tools.items():
        assert registry.get(name) is tool
    assert registry.get("not_there_1") is None


def test_property_2_duplicate_rejected_and_explicit_replace() -> None:
    registry = Registry()
    first, second = make_tool("t", "first"), make_tool("t", "second")
    registry.register(first)
    with pytest.raises(ToolError) as info:
        registry.register(second)
    assert info.value.type == "DuplicateTool" and registry.get("t") is first
    registry.register(second, replace=True)
    assert registry.get("t") is second and len(registry.list()) == 1


@given(tool_names)
def test_property_3_unregister(names: list[str]) -> None:
    registry = Registry()
    for name in names:
        registry.register(make_tool(name))
    for name in names:
        assert registry.unregister(name)
        assert registry.get(name) is None
    assert not registry.unregister("x_never")


@given(tool_names)
def test_property_4_list_sorted_and_stable(names: list[str]) -> None:
    registry = Registry()
    for name in names:
        registry.register(make_tool(name))
    listed = [t.name for t in registry.list()]
    assert listed == sorted(names)
    assert [t.name for t in registry.list()] == listed


@given(tool_names)
def test_property_5_one_schema_per_tool_in_every_format(names: list[str]) -> None:
    registry = Registry()
    for name in names:
        registry.register(make_tool(name, f"describe {name}"))
    for fmt in ("toold", "openai", "anthropic", "gemini"):
        exported = registry.export(fmt)
        assert len(exported) == len(names)
        for entry, name in zip(exported, sorted(names), strict=True):
            declaration = entry["function"] if fmt == "openai" else entry
            assert declaration["name"] == name and declaration["description"] == f"describe {name}"
            schema = declaration["input_schema" if fmt == "anthropic" else "parameters"]
            assert schema["type"] == "object" and set(schema["properties"]) == {"text", "times"}
            assert schema["required"] == ["text"]


def test_builtin_schemas_are_self_contained_and_match_validation() -> None:
    registry = Registry()
    for tool in builtin_tools():
        registry.register(tool)
    for definition in registry.definitions():
        text = msgspec.json.encode(definition.parameters).decode()
        assert "$ref" not in text and "$defs" not in text
        assert definition.parameters.get("additionalProperties") is False
    gemini = msgspec.json.encode(registry.export("gemini")).decode()
    assert "additionalProperties" not in gemini
    read_file = next(d for d in registry.definitions() if d.name == "read_file")
    assert read_file.parameters["properties"]["start_line"] == {
        "type": "integer",
        "minimum": 1,
        "description": "First line to return (1-based, inclusive)",
    }


def test_alias_resolves_but_is_not_advertised() -> None:
    registry = Registry()
    for tool in builtin_tools():
        registry.register(tool)
    assert registry.get("ls") is registry.get("list_directory")
    assert "ls" not in [d.name for d in registry.definitions()]
