"""The provider adapters against the providers' own SDKs (installed as test
dependencies; no network): every built-in tool's declaration validates with the SDK's
request types, responses built with the SDK's response types (and their dict dumps in
both spellings) give the calls, and the result messages validate with the SDK's
message types. A real daemon runs the calls in between."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic.types as anthropic_types
import ollama
import pytest
from google.genai import types as genai
from openai.types import chat, responses
from pydantic import TypeAdapter

from tests.conftest import DaemonProcess, module_daemon
from toold_client import APPROVE_ALL, Client
from toold_client.providers import UnreadableResponse, anthropic, gemini, openai
from toold_client.providers import ollama as ollama_adapter
from toold_protocol import ToolDefinition


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "providers", "") as d:
        (d.root / "a.txt").write_text("alpha\n")
        yield d


@pytest.fixture(scope="module")
def definitions(daemon: DaemonProcess) -> list[ToolDefinition]:
    with daemon.client() as c:
        found = c.tools()
    assert len(found) >= 15
    return found  # type: ignore[return-value]


def run(daemon: DaemonProcess, calls: list[dict[str, Any]]) -> Any:
    with Client(daemon.endpoint, timeout=30) as c:
        return c.submit(calls, on_confirm=lambda _request: APPROVE_ALL)


# ---- declarations --------------------------------------------------------------------------


def test_every_declaration_validates_with_the_sdks_request_types(definitions: list[ToolDefinition]) -> None:
    chat_tool = TypeAdapter(chat.ChatCompletionFunctionToolParam)
    response_tool = TypeAdapter(responses.FunctionToolParam)
    anthropic_tool = TypeAdapter(anthropic_types.ToolParam)
    for declared in openai.tools(definitions):
        chat_tool.validate_python(declared, strict=True)
    for declared in openai.response_tools(definitions):
        response_tool.validate_python(declared, strict=True)
        assert declared["strict"] is False
    for declared in anthropic.tools(definitions):
        anthropic_tool.validate_python(declared, strict=True)
    (gemini_tool,) = gemini.tools(definitions)
    parsed = genai.Tool.model_validate(gemini_tool)  # extra keys are forbidden at every depth
    assert parsed.function_declarations is not None and len(parsed.function_declarations) == len(definitions)
    for declared in ollama_adapter.tools(definitions):
        ollama.Tool.model_validate(declared)


def test_gemini_reduction_reaches_nested_schemas() -> None:
    """An exclusive bound inside ``anyOf`` (``web_fetch.timeout_seconds``) is what the SDK
    refused; every depth is reduced, and the bound kept as an inclusive one."""
    schema = {
        "type": "object",
        "properties": {
            "t": {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "title": "T"}, {"type": "null"}]},
            "n": {"type": "array", "items": {"type": "integer", "exclusiveMaximum": 10, "const": 3}},
            "s": {"const": "only"},
        },
        "additionalProperties": False,
    }
    definition = ToolDefinition(name="x", description="d", parameters=schema)
    (tool,) = gemini.tools([definition])
    parsed = genai.Tool.model_validate(tool)
    (declared,) = parsed.function_declarations or []
    assert declared.parameters is not None and declared.parameters.properties is not None
    t, n = declared.parameters.properties["t"], declared.parameters.properties["n"]
    assert declared.parameters.properties["s"].enum == ["only"]
    assert t.minimum == 0 and t.nullable is True and t.any_of is None
    assert n.items is not None and n.items.maximum == 9
    assert n.items.enum is None  # Gemini enums are of strings: an integer const cannot be one


# ---- calls from SDK responses --------------------------------------------------------------

READ = {"path": "a.txt"}


def openai_completion() -> chat.ChatCompletion:
    call = chat.ChatCompletionMessageFunctionToolCall(
        id="call_1", type="function", function={"name": "read_file", "arguments": '{"path": "a.txt"}'}
    )
    message = chat.ChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
    choice = {"index": 0, "finish_reason": "tool_calls", "message": message, "logprobs": None}
    return chat.ChatCompletion(id="x", choices=[choice], created=0, model="m", object="chat.completion")


def openai_response() -> responses.Response:
    item = responses.ResponseFunctionToolCall(
        type="function_call", call_id="call_r", name="read_file", arguments='{"path": "a.txt"}', id="fc_1"
    )
    return responses.Response.model_validate(
        {
            "id": "resp",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": [item.model_dump()],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


def anthropic_message() -> anthropic_types.Message:
    block = anthropic_types.ToolUseBlock(id="toolu_1", name="read_file", input=READ, type="tool_use")
    return anthropic_types.Message(
        id="msg",
        content=[anthropic_types.TextBlock(type="text", text="reading"), block],
        model="m",
        role="assistant",
        stop_reason="tool_use",
        type="message",
        usage=anthropic_types.Usage(input_tokens=1, output_tokens=1),
    )


def gemini_response() -> genai.GenerateContentResponse:
    part = genai.Part(function_call=genai.FunctionCall(name="read_file", args=READ))
    return genai.GenerateContentResponse(
        candidates=[genai.Candidate(content=genai.Content(role="model", parts=[genai.Part(text="hm"), part]))]
    )


def ollama_response() -> ollama.ChatResponse:
    call = ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(name="read_file", arguments=READ))
    return ollama.ChatResponse(model="m", message=ollama.Message(role="assistant", tool_calls=[call]))


def shapes(response: Any) -> list[Any]:
    """The SDK object and the dicts people pass instead: snake_case dumps, camelCase ones."""
    found = [response, response.model_dump(), response.model_dump(mode="json", exclude_none=True)]
    found.append(response.model_dump(mode="json", by_alias=True, exclude_none=True))
    to_json_dict = getattr(response, "to_json_dict", None)
    if callable(to_json_dict):
        found.append(to_json_dict())
    return found


@pytest.mark.parametrize(
    ("adapter", "make", "call_id"),
    [
        (openai.calls, openai_completion, "call_1"),
        (openai.response_calls, openai_response, "call_r"),
        (anthropic.calls, anthropic_message, "toolu_1"),
        (gemini.calls, gemini_response, "call_0"),
        (ollama_adapter.calls, ollama_response, "call_0"),
    ],
    ids=["openai-chat", "openai-responses", "anthropic", "gemini", "ollama"],
)
def test_calls_come_from_sdk_objects_and_their_dumps_in_both_spellings(adapter: Any, make: Any, call_id: str) -> None:
    for shape in shapes(make()):
        assert adapter(shape) == [{"id": call_id, "name": "read_file", "arguments": READ}], type(shape)


def test_a_response_an_adapter_cannot_read_is_an_error_not_zero_calls() -> None:
    for adapter, wrong in [
        (gemini.calls, openai_completion()),  # another provider's response
        (openai.calls, gemini_response()),
        (anthropic.calls, {"choices": []}),
        (ollama_adapter.calls, "a string"),
        (openai.response_calls, openai_completion()),
    ]:
        with pytest.raises(UnreadableResponse, match="cannot read tool calls"):
            adapter(wrong)
    assert openai.calls({"choices": [{"message": {"role": "assistant", "content": "done"}}]}) == []  # a final answer


# ---- results with SDK message types, through a real daemon ----------------------------------


def test_results_validate_with_the_sdks_message_types(daemon: DaemonProcess) -> None:
    outcome = run(daemon, openai.calls(openai_completion()))
    assert outcome.results[0].ok and "alpha" in outcome.results[0].content
    for message in openai.results(outcome):
        TypeAdapter(chat.ChatCompletionToolMessageParam).validate_python(message, strict=True)

    outcome = run(daemon, openai.response_calls(openai_response()))
    for item in openai.response_results(outcome):
        TypeAdapter(responses.ResponseInputItemParam).validate_python(item)
        assert item["call_id"] == "call_r"

    outcome = run(daemon, anthropic.calls(anthropic_message()))
    (message,) = anthropic.results(outcome)
    TypeAdapter(anthropic_types.MessageParam).validate_python(message, strict=True)
    assert message["content"][0]["tool_use_id"] == "toolu_1"

    outcome = run(daemon, gemini.calls(gemini_response()))
    (content,) = gemini.results(outcome)
    parsed = genai.Content.model_validate(content)
    assert parsed.parts is not None and parsed.parts[0].function_response is not None
    assert parsed.parts[0].function_response.name == "read_file"

    outcome = run(daemon, ollama_adapter.calls(ollama_response()))
    for message in ollama_adapter.results(outcome):
        assert ollama.Message.model_validate(message).tool_name == "read_file"


def test_malformed_json_arguments_get_a_clear_error_for_that_call(daemon: DaemonProcess) -> None:
    completion = openai_completion().model_dump()
    completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"path": "a.txt"'
    outcome = run(daemon, openai.calls(completion))
    (result,) = outcome.results
    assert not result.ok and result.error is not None and result.error.type == "BadArgs"
    assert "must be a JSON object" in result.content and "not valid JSON" in result.content, result.content
    assert '{"path": "a.txt"' in result.content
    TypeAdapter(chat.ChatCompletionToolMessageParam).validate_python(openai.results(outcome)[0], strict=True)
