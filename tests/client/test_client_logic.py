"""Client logic through the transport seam: no daemon needed (the e2e tests use a real one)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import msgspec
import pytest

import toold_protocol as p
from toold_client import Client, ProtocolError, RemoteError, RequestTimeout


class ScriptedTransport:
    """Answers each request with what ``respond`` returns (a list of messages)."""

    def __init__(self, respond: Callable[[p.ClientMessage], list[msgspec.Struct]]) -> None:
        self.respond = respond
        self.inbox: collections.deque[bytes] = collections.deque()
        self.sent: list[p.ClientMessage] = []
        self.closed = False

    def send(self, frame: bytes) -> None:
        message = p.decode_client_message(frame)
        self.sent.append(message)
        self.inbox.extend(p.encode(m) for m in self.respond(message))

    def recv(self, timeout: float | None) -> bytes | None:
        return self.inbox.popleft() if self.inbox else None

    def close(self) -> None:
        self.closed = True


def ok(call_id: str, content: str) -> p.ToolResult:
    return p.ToolResult(call_id=call_id, ok=True, content=content)


def test_events_of_another_batch_are_kept_until_asked_for() -> None:
    def respond(message: p.ClientMessage) -> list[msgspec.Struct]:
        assert isinstance(message, p.SubmitBatch)
        c = message.calls[0].call_id
        other = p.BatchFinished(batch_id="other", state="finished", results=[ok("o", "other")])
        return [
            other,
            p.BatchAccepted(id=message.id, batch_id="mine", calls=[]),
            p.CallStarted(batch_id="mine", call_id=c, index=0, name="read_file"),
            p.BatchFinished(batch_id="mine", state="finished", results=[ok(c, "hello")]),
        ]

    with Client("ipc:///nowhere", transport=ScriptedTransport(respond)) as client:
        seen: list[str] = []
        outcome = client.submit(
            [{"name": "read_file", "arguments": {"path": "a"}}], on_event=lambda e: seen.append(type(e).__name__)
        )
        assert outcome.results[0].content == "hello" and seen == ["CallStarted", "BatchFinished"]
        assert client.wait_batch("other").results[0].content == "other"


def test_remote_error_and_timeout_and_unexpected_reply() -> None:
    def respond(message: p.ClientMessage) -> list[msgspec.Struct]:
        if isinstance(message, p.Cancel):
            return [p.Error(id=message.id, code="UNKNOWN_BATCH", message="no batch")]
        if isinstance(message, p.GetBatch):
            return [p.Pong(id=message.id)]
        return []

    with Client("ipc:///nowhere", transport=ScriptedTransport(respond), timeout=0.05) as client:
        with pytest.raises(RemoteError) as info:
            client.cancel("b")
        assert info.value.code == "UNKNOWN_BATCH"
        with pytest.raises(RequestTimeout):
            client.ping()
        with pytest.raises(ProtocolError):
            client.get_batch("b")


def test_call_ids_are_generated_unique_and_arguments_travel_encoded() -> None:
    transport = ScriptedTransport(lambda m: [])
    with Client("ipc:///nowhere", transport=transport, timeout=0.01) as client, pytest.raises(RequestTimeout):
        client.submit([{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": '{"y": 2}'}])
    sent = transport.sent[0]
    assert isinstance(sent, p.SubmitBatch)
    assert [c.call_id for c in sent.calls] == ["call_0", "call_1"]
    assert [msgspec.msgpack.decode(c.arguments) for c in sent.calls] == [{"x": 1}, {"y": 2}]
    assert transport.closed


def test_connection_lines_count_the_connections_a_result_does_not_list() -> None:
    from toold_client._connections import connection_lines

    listed = {
        "host": "pypi.example",
        "port": 443,
        "protocol": "connect",
        "allowed_by": "rule",
        "sent": 1,
        "received": 2,
    }
    omitted = {"connections": 7, "refused": 3, "sent": 10, "received": 20}
    result = p.ToolResult(call_id="c", ok=True, content="", data={"network": [listed], "network_omitted": omitted})
    lines = connection_lines(result)
    assert lines[0] == "-> pypi.example:443 (connect) allowed: rule; sent 1 B, received 2 B"
    assert lines[1] == "-> and 7 more connection(s) not listed (3 refused); sent 10 B, received 20 B"
    assert connection_lines(p.ToolResult(call_id="c", ok=True, content="", data={"network": [listed]})) == lines[:1]
