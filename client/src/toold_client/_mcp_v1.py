"""``toolctl mcp`` served with the MCP SDK's 1.x line: the low-level ``Server``'s
decorators, ``ServerSession`` for elicitation, roots and progress, and a filter on the
stdio streams where that line strays from the protocol (see ``_conforming``)."""

from __future__ import annotations

import contextlib
import sys
import typing
from io import TextIOWrapper
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage

from ._errors import TooldError
from .mcp_bridge import SERVER_NAME, Bridge, version


class SessionPeer:
    """One request's client through the 1.x ``ServerSession``."""

    def __init__(self, session: ServerSession, progress_token: Any = None) -> None:
        self.session = session
        self.progress_token = progress_token

    def can_elicit(self) -> bool:
        return self.session.check_client_capability(types.ClientCapabilities(elicitation=types.ElicitationCapability()))

    async def elicit(self, message: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        answer = await self.session.elicit(message, schema)
        return answer.action, answer.content

    def wants_progress(self) -> bool:
        return self.progress_token is not None

    async def progress(self, done: float, message: str) -> None:
        await self.session.send_progress_notification(self.progress_token, done, message=message)

    async def root_uris(self) -> list[str] | None:
        if not self.session.check_client_capability(types.ClientCapabilities(roots=types.RootsCapability())):
            return None
        return [str(root.uri) for root in (await self.session.list_roots()).roots]


def build_server(bridge: Bridge) -> Server[Any, Any]:
    server: Server[Any, Any] = Server(SERVER_NAME, version=version())

    @server.list_tools()  # type: ignore[no-untyped-call,untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        try:
            return await bridge.list_tools(SessionPeer(server.request_context.session))
        except TooldError as exc:  # no daemon, or it refused: a JSON-RPC error with its reason
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=str(exc))) from None

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]  # the daemon validates (BadArgs)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        context = server.request_context
        token = context.meta.progressToken if context.meta is not None else None
        return await bridge.call_tool(SessionPeer(context.session, token), name, arguments)

    return server


async def serve_stdio(bridge: Bridge) -> None:
    """Serve until the client closes stdin. The SDK's stdout writer runs until its stream
    is closed, and the session closes only its own end of ``_conforming``'s streams: the
    stdout stream is closed here, or the bridge would outlive the session. The text layer
    over stdout is ours and let go of at the end, so that it does not close stdout itself
    when it is collected (``toolctl`` flushes stdout as it exits)."""
    server = build_server(bridge)
    stdout = TextIOWrapper(sys.stdout.buffer, encoding="utf-8")
    try:
        async with (
            stdio_server(stdout=anyio.wrap_file(stdout)) as (read_stream, write_stream),
            write_stream,
            anyio.create_task_group() as group,
        ):
            inbound, outbound = _conforming(group, read_stream, write_stream)
            await server.run(inbound, outbound, server.create_initialization_options())
            group.cancel_scope.cancel()
    finally:
        with contextlib.suppress(OSError, ValueError):  # a client gone: nothing more to flush
            stdout.detach()


#: The methods a client may call (the SDK's own list); any other is -32601.
_CLIENT_METHODS = frozenset(
    typing.get_args(request.model_fields["method"].annotation)[0]
    for request in typing.get_args(types.ClientRequest.model_fields["root"].annotation)
)
_METHOD_NOT_FOUND = -32601


def _conforming(
    group: anyio.abc.TaskGroup,
    read_stream: MemoryObjectReceiveStream[SessionMessage | Exception],
    write_stream: MemoryObjectSendStream[SessionMessage],
) -> tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]:
    """The stdio streams, kept to the protocol where the SDK strays: a request for an
    unknown method is answered -32601 (the SDK's validation answers -32602), and a
    request the client cancelled gets no reply at all, as the specification asks."""
    to_server, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    server_writes, from_server = anyio.create_memory_object_stream[SessionMessage](16)
    cancelled: set[Any] = set()

    async def inbound() -> None:
        async with to_server:
            async for item in read_stream:
                message = item.message.root if isinstance(item, SessionMessage) else None
                if isinstance(message, types.JSONRPCRequest) and message.method not in _CLIENT_METHODS:
                    error = types.ErrorData(code=_METHOD_NOT_FOUND, message=f"Method not found: {message.method}")
                    reply = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
                    await write_stream.send(SessionMessage(types.JSONRPCMessage(reply)))
                    continue
                if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                    cancelled.add((message.params or {}).get("requestId"))
                await to_server.send(item)

    async def outbound() -> None:
        async with from_server:
            async for item in from_server:
                message = item.message.root
                if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)) and message.id in cancelled:
                    cancelled.discard(message.id)
                    continue
                await write_stream.send(item)

    group.start_soon(inbound)
    group.start_soon(outbound)
    return server_reads, server_writes
