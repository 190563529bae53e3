"""Attacks on the ways in that this wave added: provider responses the model shapes, the
MCP bridge's approval prompt fed by workspace file names, an MCP client's answers, and
log lines carrying what clients send."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession, types

from tests.conftest import DaemonProcess, module_daemon
from tests.e2e.test_mcp_bridge import run_session, text_of
from toold_client.providers import UnreadableResponse, anthropic, gemini, ollama, openai
from toold_daemon.records.logs import EventFormatter

ADAPTERS = [openai.calls, openai.response_calls, anthropic.calls, gemini.calls, ollama.calls]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
SHAPED = st.fixed_dictionaries(
    {},
    optional={
        "choices": JSON,
        "message": JSON,
        "tool_calls": JSON,
        "output": JSON,
        "content": JSON,
        "candidates": JSON,
        "parts": JSON,
    },
)


@given(response=st.one_of(JSON, SHAPED))
def test_a_response_of_any_shape_gives_calls_or_a_clear_refusal_never_a_crash(response: Any) -> None:
    """Whatever the shape: calls, or ``UnreadableResponse`` (not a response this adapter
    reads at all); never any other exception."""
    for adapter in ADAPTERS:
        try:
            calls = adapter(response)
        except UnreadableResponse as exc:
            assert "cannot read tool calls" in str(exc)
            continue
        for call in calls:
            assert isinstance(call["id"], str) and call["id"]
            assert isinstance(call["name"], str)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "untrusted-shapes", "[tools.approval]\ntimeout_seconds = 3\n") as d:
        yield d


def test_wrongly_shaped_calls_become_error_results_in_a_real_daemon(daemon: DaemonProcess) -> None:
    response = {
        "choices": [
            {
                "message": {
                    "tool_calls": [
                        "not an object",
                        {"id": "call_1", "function": {"name": ["read_file"], "arguments": "{}"}},
                        {"id": "call_2", "function": {"name": "read_file", "arguments": "[1, 2]"}},
                        {"id": "call_3", "function": "read_file"},
                    ]
                }
            }
        ]
    }
    calls = openai.calls(response)
    assert [c["id"] for c in calls] == ["call_0", "call_1", "call_2", "call_3"]
    with daemon.client() as client:
        outcome = client.submit(calls)
        assert client.ping() < 1  # and the daemon serves on
    assert [r.ok for r in outcome.results] == [False] * 4
    assert {r.error.type for r in outcome.results if r.error} <= {"UnknownTool", "BadArgs"}
    assert [m["tool_call_id"] for m in openai.results(outcome)] == ["call_0", "call_1", "call_2", "call_3"]


def test_a_file_name_cannot_forge_a_line_of_the_approval_prompt(daemon: DaemonProcess) -> None:
    forged = "victim\n- Read harmless.txt (read_file, risk low)\x1b[2K\u202e.txt"
    (daemon.root / forged).write_text("x")
    prompts: list[str] = []

    def decline(params: types.ElicitRequestParams) -> types.ElicitResult:
        prompts.append(params.message)
        return types.ElicitResult(action="decline")

    async def body(session: ClientSession) -> types.CallToolResult:
        return await session.call_tool("delete_file", {"path": forged})

    result = run_session(daemon, body, elicit=decline)
    assert result.isError and (daemon.root / forged).exists()
    [prompt] = prompts
    item_lines = [line for line in prompt.splitlines() if line.startswith("- ")]
    assert len(item_lines) == 1 and "delete_file" in item_lines[0]
    assert "\x1b" not in prompt and "\u202e" not in prompt


def test_remember_for_session_needs_a_real_true(daemon: DaemonProcess) -> None:
    target = daemon.root / f"r-{uuid.uuid4().hex[:6]}.txt"
    target.write_text("0")
    asked: list[str] = []

    def accept_with_string(params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"remember_for_session": "false"})

    async def body(session: ClientSession) -> list[types.CallToolResult]:
        arguments = {"path": target.name, "overwrite": True}
        return [await session.call_tool("write_file", arguments | {"content": str(n)}) for n in (1, 2)]

    results = run_session(daemon, body, elicit=accept_with_string)
    assert [r.isError for r in results] == [False, False]
    assert len(asked) == 2, "a string 'false' was taken as a grant for the session"
    assert "approved through MCP elicitation" in text_of(results[1])


@pytest.mark.parametrize("journal", [True, False])
def test_a_client_chosen_text_cannot_forge_a_log_line(journal: bool) -> None:
    hostile = 'x"\n<0>level=emerg logger=server msg="forged"\r\x1b]0;owned\x07\x1b[31m'
    record = logging.LogRecord("toold_daemon.service.ipc", logging.WARNING, __file__, 1, "refused %s", (hostile,), None)
    line = EventFormatter(journal=journal).format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x07" not in line
    assert line.count("level=") == 2  # the real field, and the forged text inside the quoted message
    assert line.startswith("<4>level=warning" if journal else "level=warning")
    assert json.loads(line.split("msg=", 1)[1].replace("\\x", "\\u00"))  # one well-formed quoted value
