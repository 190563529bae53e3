"""The wire: round trips, stable tags, unknown fields ignored, typed decode failures."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import toold_protocol as p

CLIENT_TAGS = {
    "undo_batch",
    "explain_policy",
    "reload_policy",
    "hello",
    "list_tools",
    "submit_batch",
    "confirm",
    "cancel",
    "subscribe",
    "supply_result",
    "get_batch",
    "ping",
    "list_batches",
    "list_connections",
    "recover",
    "prune_journal",
    "get_stats",
}
DAEMON_TAGS = {
    "policy_explanation",
    "welcome",
    "tool_list",
    "batch_accepted",
    "confirmation_requested",
    "call_started",
    "output_chunk",
    "call_finished",
    "batch_finished",
    "batch_status",
    "ack",
    "error",
    "pong",
    "batch_list",
    "connection_list",
    "pruned",
    "stats",
}


def tags(union: object) -> set[str]:
    return {t.__struct_config__.tag for t in union.__args__}  # type: ignore[attr-defined]


def test_tags_are_stable() -> None:
    assert tags(p.ClientMessage) == CLIENT_TAGS
    assert tags(p.DaemonMessage) == DAEMON_TAGS


def test_submit_batch_round_trip_keeps_arguments_encoded() -> None:
    args = {"path": "a.txt", "start_line": 2}
    frame = p.encode(
        p.SubmitBatch(
            id=7, calls=[p.ToolCall(call_id="c1", name="read_file", arguments=msgspec.Raw(p.encode_value(args)))]
        )
    )
    message = p.decode_client_message(frame)
    assert isinstance(message, p.SubmitBatch) and message.id == 7
    assert isinstance(message.calls[0].arguments, msgspec.Raw)
    assert msgspec.msgpack.decode(message.calls[0].arguments) == args


def test_unknown_fields_are_ignored_both_ways() -> None:
    frame = p.encode_value({"type": "ping", "id": 1, "from_the_future": [1, 2]})
    assert p.decode_client_message(frame) == p.Ping(id=1)
    pong = p.encode_value({"type": "pong", "id": 1, "extra": {"x": 1}})
    assert p.decode_daemon_message(pong) == p.Pong(id=1)


@pytest.mark.parametrize(
    ("frame", "code", "request_id"),
    [
        (b"\xc1", "MALFORMED_FRAME", None),
        (p.encode_value([1, 2]), "MALFORMED_FRAME", None),
        (p.encode_value({"id": 3}), "MALFORMED_FRAME", 3),
        (p.encode_value({"type": "launch_missiles", "id": 4}), "UNKNOWN_MESSAGE_TYPE", 4),
        (p.encode_value({"type": "ping", "id": "five"}), "INVALID_MESSAGE", None),
        (p.encode_value({"type": "cancel", "id": 6}), "INVALID_MESSAGE", 6),
        (
            p.encode_value({"type": "submit_batch", "id": 7, "calls": [{"call_id": "", "name": "x"}]}),
            "INVALID_MESSAGE",
            7,
        ),
        (p.encode_value({"type": "submit_batch", "id": 8, "calls": [], "batch_id": "../../etc"}), "INVALID_MESSAGE", 8),
        (p.encode_value({"type": "list_connections", "id": 9, "limit": 0}), "INVALID_MESSAGE", 9),
        (p.encode_value({"type": "list_connections", "id": 10, "limit": 10**9}), "INVALID_MESSAGE", 10),
        (p.encode_value({"type": "list_connections", "id": 11, "server": "x" * 129}), "INVALID_MESSAGE", 11),
        (p.encode_value({"type": "list_connections", "id": 12, "server": 7}), "INVALID_MESSAGE", 12),
    ],
)
def test_decode_failures_are_typed(frame: bytes, code: str, request_id: int | None) -> None:
    with pytest.raises(p.DecodeFailure) as info:
        p.decode_client_message(frame)
    assert info.value.code == code and info.value.request_id == request_id


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_other_exceptions(frame: bytes) -> None:
    try:
        p.decode_client_message(frame)
    except p.DecodeFailure:
        pass


def test_daemon_messages_round_trip() -> None:
    result = p.ToolResult(
        call_id="c",
        ok=False,
        content="Error",
        error=p.ToolErrorInfo(type="BadArgs", code="BAD_ARGS", message="m", details={"k": 1}),
        duration_ms=1.5,
    )
    for message in [
        p.Welcome(
            id=1,
            protocol_version=1,
            daemon_version="0.1",
            session_id="s",
            identity=p.Identity(uid=1, gid=2, pid=3),
            tools_mode="enabled",
            roots=["/r"],
        ),
        p.BatchAccepted(
            id=2,
            batch_id="b",
            calls=[p.PlannedCall(index=0, call_id="c", name="read_file", disposition="resolved", result=result)],
        ),
        p.CallFinished(batch_id="b", index=0, result=result),
        p.BatchFinished(batch_id="b", state="finished", results=[result]),
        p.OutputChunk(batch_id="b", call_id="c", stream="stderr", data="x", seq=3),
        p.Error(id=None, code="MALFORMED_FRAME", message="bad"),
    ]:
        assert p.decode_daemon_message(p.encode(message)) == message
