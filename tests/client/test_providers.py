"""Provider adapters: responses shaped as each provider documents them, run as one
batch on a real daemon, answered in the provider's shape, order and ids kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import Client
from toold_client.providers import anthropic, gemini, ollama, openai


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "providers", "") as d:
        (d.root / "a.txt").write_text("alpha\n")
        (d.root / "ü.txt").write_text("ünïcödé ✓\n")
        yield d


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


OPENAI_CHAT = {
    "id": "chatcmpl-abc123",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_Zq2",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "ü.txt"}'},
                    },
                    {
                        "id": "call_Aa1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "missing.txt"}'},
                    },
                    {
                        "id": "call_Bb7",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.t'},
                    },
                    {
                        "id": "call_Cc3",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                    },
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
}


def test_openai_chat_round_trip(client: Client) -> None:
    calls = openai.calls(OPENAI_CHAT)
    assert [c["id"] for c in calls] == ["call_Zq2", "call_Aa1", "call_Bb7", "call_Cc3"]
    assert calls[0]["arguments"] == {"path": "ü.txt"} and calls[2]["arguments"] == '{"path": "a.t'
    outcome = client.submit(calls)
    messages = openai.results(outcome)
    assert [m["tool_call_id"] for m in messages] == ["call_Zq2", "call_Aa1", "call_Bb7", "call_Cc3"]
    assert all(m["role"] == "tool" for m in messages)
    assert "ünïcödé ✓" in messages[0]["content"] and "alpha" in messages[3]["content"]
    assert outcome.results[1].error is not None and outcome.results[1].error.type == "FileNotFound"
    assert outcome.results[2].error is not None and outcome.results[2].error.type == "BadArgs"  # malformed JSON
    json.dumps(messages)  # plain data, ready for the next request


def test_openai_tools_match_the_daemons_own_export(client: Client) -> None:
    definitions = client.tools()
    mine = openai.tools(definitions)  # type: ignore[arg-type]
    assert mine == client.tools("openai")
    assert {"type", "function"} == set(mine[0]) and mine[0]["function"]["parameters"]["type"] == "object"
    responses = openai.response_tools(definitions)  # type: ignore[arg-type]
    assert responses[0]["type"] == "function" and responses[0]["name"] == mine[0]["function"]["name"]


def test_openai_responses_api_round_trip(client: Client) -> None:
    response = {
        "id": "resp_1",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_X",
                "name": "read_file",
                "arguments": '{"path":"a.txt"}',
            },
            {"type": "message", "id": "msg_1", "role": "assistant", "content": []},
            {"type": "function_call", "id": "fc_2", "call_id": "call_Y", "name": "no_such_tool", "arguments": "{}"},
        ],
    }
    calls = openai.response_calls(response)
    assert [c["id"] for c in calls] == ["call_X", "call_Y"]
    items = openai.response_results(client.submit(calls))
    assert [(i["type"], i["call_id"]) for i in items] == [
        ("function_call_output", "call_X"),
        ("function_call_output", "call_Y"),
    ]
    assert "alpha" in items[0]["output"] and "no_such_tool" in items[1]["output"]


def test_anthropic_round_trip(client: Client) -> None:
    response = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I'll read both files."},
            {"type": "tool_use", "id": "toolu_02", "name": "read_file", "input": {"path": "missing.txt"}},
            {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "ü.txt"}},
        ],
        "stop_reason": "tool_use",
    }
    calls = anthropic.calls(response)
    assert [c["id"] for c in calls] == ["toolu_02", "toolu_01"]
    messages = anthropic.results(client.submit(calls))
    assert len(messages) == 1 and messages[0]["role"] == "user"
    blocks = messages[0]["content"]
    assert [(b["tool_use_id"], b["is_error"]) for b in blocks] == [("toolu_02", True), ("toolu_01", False)]
    assert "ünïcödé ✓" in blocks[1]["content"]
    declared = anthropic.tools(client.tools())  # type: ignore[arg-type]
    assert declared == client.tools("anthropic") and "input_schema" in declared[0]


def test_gemini_round_trip_with_and_without_ids(client: Client) -> None:
    response = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Reading."},
                        {"functionCall": {"name": "read_file", "args": {"path": "a.txt"}}},
                        {"functionCall": {"name": "read_file", "args": {"path": "missing.txt"}}},
                        {"functionCall": {"id": "given-7", "name": "list_directory", "args": {"path": "."}}},
                    ],
                }
            }
        ]
    }
    calls = gemini.calls(response)
    assert [c["id"] for c in calls] == ["call_0", "call_1", "given-7"]
    assert gemini.calls(response) == calls  # stable: the same response gives the same ids
    outcome = client.submit(calls)
    content = gemini.results(outcome)[0]
    parts = [part["functionResponse"] for part in content["parts"]]
    assert [(p["id"], p["name"]) for p in parts] == [
        ("call_0", "read_file"),
        ("call_1", "read_file"),
        ("given-7", "list_directory"),
    ]
    assert "alpha" in parts[0]["response"]["output"] and "error" in parts[1]["response"]
    with pytest.raises(ValueError, match="BatchOutcome"):
        gemini.results(outcome.results)  # results alone do not say which function answered
    declared = gemini.tools(client.tools())[0]["functionDeclarations"]  # type: ignore[arg-type]
    assert declared == client.tools("gemini")
    assert all("additionalProperties" not in json.dumps(d["parameters"]) for d in declared)


def test_ollama_round_trip(client: Client) -> None:
    response = {
        "model": "llama3.1",
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": "read_file", "arguments": {"path": "ü.txt"}}},
                {"function": {"name": "read_file", "arguments": {"path": "a.txt"}}},
            ],
        },
        "done": True,
    }
    calls = ollama.calls(response)
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    messages = ollama.results(client.submit(calls))
    assert [(m["role"], m["tool_name"]) for m in messages] == [("tool", "read_file"), ("tool", "read_file")]
    assert "ünïcödé ✓" in messages[0]["content"] and "alpha" in messages[1]["content"]


@pytest.mark.parametrize(
    ("adapter", "empty"),
    [
        (openai.calls, {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}),
        (openai.response_calls, {"output": []}),
        (anthropic.calls, {"content": [{"type": "text", "text": "hi"}]}),
        (gemini.calls, {"candidates": [{"content": {"parts": [{"text": "hi"}]}}]}),
        (ollama.calls, {"message": {"role": "assistant", "content": "hi"}}),
    ],
)
def test_a_response_without_tool_calls_has_none(adapter: Any, empty: dict[str, Any]) -> None:
    assert adapter(empty) == []
