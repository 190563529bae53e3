"""An MCP stdio connection writes whole lines whatever cancels a request.

The server is the test itself, at the other end of a real pipe (or a lockstep stream): a
write goes through only as fast as the test reads, so a request can be cancelled half
written.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import trio
import trio.testing

from toold_daemon.mcp import connection as connection_module
from toold_daemon.mcp.connection import Connection, ServerBroken


async def _no_requests(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    return None


def _connection(stream: trio.abc.Stream) -> Connection:
    return Connection(stream, _no_requests, lambda method, params: None)


async def test_a_request_cancelled_half_written_still_leaves_whole_lines() -> None:
    read_end, write_end = os.pipe()
    server, ours = trio.lowlevel.FdStream(read_end), trio.lowlevel.FdStream(write_end)
    connection = _connection(ours)
    big = {"text": "x" * 200_000}  # over the pipe's 64 KiB: its write waits for the reader
    async with trio.open_nursery() as nursery:

        async def cancelled_request(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await connection.request("tools/call", big)

        scope = await nursery.start(cancelled_request)
        first_bytes = await server.receive_some(100)  # the request is under way, not finished
        await trio.testing.wait_all_tasks_blocked()  # its write waits for room in the pipe
        scope.cancel()
        nursery.start_soon(connection.notify, "notifications/next")
        received = bytearray(first_bytes)
        with trio.fail_after(5):
            while received.count(b"\n") < 3:  # the request, its cancellation, the next message
                received += await server.receive_some(1 << 20)
    await ours.aclose()
    await server.aclose()
    lines = [json.loads(line) for line in bytes(received).splitlines()]
    assert lines[0]["method"] == "tools/call" and lines[0]["params"] == big
    assert {line["method"] for line in lines[1:]} == {"notifications/cancelled", "notifications/next"}


async def test_a_server_that_reads_nothing_breaks_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "SEND_TIMEOUT_SECONDS", 0.2)
    ours, _server = trio.testing.lockstep_stream_pair()
    connection = _connection(ours)
    with trio.fail_after(5), pytest.raises(ServerBroken):
        await connection.request("tools/list", {})
    assert "read none of its input" in connection.broken
    with pytest.raises(ServerBroken):
        await connection.notify("notifications/next")
