"""What a third-party MCP server says is untrusted: any JSON at all in its tool list or
a call's result gives tools we can vouch for, or a typed error, never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.config import McpServerConfig
from toold_daemon.errors import ToolError
from toold_daemon.mcp.tools import output_of, server_of, tools_of

SERVER = McpServerConfig(name="srv", command="/bin/true")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


@given(json_values)
def test_any_tool_list_gives_valid_tools_or_reasons(listed: Any) -> None:
    found = tools_of(SERVER, listed)
    for tool in found.tools:
        assert tool.name.startswith("mcp__srv__") and server_of(tool.name) == "srv"
        assert tool.json_schema is not None and tool.json_schema["type"] == "object"


@given(st.dictionaries(st.sampled_from(["content", "structuredContent", "isError", "x"]), json_values))
def test_any_call_result_gives_output_or_a_typed_error(result: dict[str, Any]) -> None:
    try:
        output = output_of(result)
    except ToolError as exc:
        assert exc.code == "MCP_TOOL_ERROR"
        return
    assert isinstance(output.content, str)


def test_names_schemas_and_annotations_are_checked() -> None:
    listed = [
        {"name": "ok", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}},
        {"name": "../../etc", "inputSchema": {"type": "object"}},
        {"name": "x" * 65, "inputSchema": {"type": "object"}},
        {"name": "bad_schema", "inputSchema": {"type": "object", "properties": 3}},
        {"name": "ok", "inputSchema": {"type": "object"}},
        {"name": "ctl", "description": "line\x1b[31m\x00red", "inputSchema": {"type": "object"}},
    ]
    found = tools_of(SERVER, listed)
    assert [t.remote_name for t in found.tools] == ["ok", "ctl"]
    assert len(found.skipped) == 4
    assert found.tools[0].side_effecting  # readOnlyHint is the server's word, not trusted
    assert "\x1b" not in found.tools[1].description and "\x00" not in found.tools[1].description
    trusted = tools_of(McpServerConfig(name="srv", command="/bin/true", trust_annotations=True), listed)
    assert not trusted.tools[0].side_effecting


def test_content_blocks_other_than_text_are_described_not_passed() -> None:
    output = output_of(
        {"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "QUJD" * 100, "mimeType": "image/png"}]}
    )
    assert output.content.startswith("a\n[image image/png, about 300 bytes")
    with pytest.raises(ToolError):
        output_of({"content": [{"type": "text", "text": "boom"}], "isError": True})


@pytest.mark.parametrize("name", ["mcp__srv__tool", "mcp__a-b__c__d"])
def test_server_of_splits_at_the_first_separator(name: str) -> None:
    assert server_of(name) == name.split("__")[1]


def test_a_server_listing_thousands_of_tools_is_cut() -> None:
    listed = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(5000)]
    found = tools_of(SERVER, listed)
    assert len(found.tools) == 256 and "more than 256 tools" in found.skipped[-1]
