"""``toolctl mcp``: the daemon's tools offered to any MCP client over stdio.

Each ``tools/call`` becomes a one-call batch in the daemon, so the policy, approvals,
journal and confinement apply as to every other client. When the daemon asks for
approval, the person is asked through MCP elicitation if the client supports it
(accept approves, decline or cancel denies); otherwise an approver (``toolctl watch``,
``toolctl approve``) decides until the approval timeout. Output chunks become progress
notifications when the request carries a progress token; a cancelled request cancels
the batch. The session's workspace is ``--workspace``, else the client's first
``file://`` root, else the daemon's roots.

Needs the MCP SDK: ``pip install 'toold-client[mcp]'``.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from toold_protocol import (
    ConfirmationRequested,
    DaemonMessage,
    OutputChunk,
    ToolDefinition,
    ToolResult,
    sanitize_for_terminal,
)

from ._async_client import AsyncClient
from ._requests import APPROVE_ALL, DENY_ALL, Decision

SERVER_NAME = "toold"


@dataclass
class Asking:
    """How the approvals of one call went, for the note in its result."""

    asked: bool = False
    answers: list[str] = field(default_factory=list)


class Bridge:
    """One MCP session's link to the daemon: one daemon session, opened on first use."""

    def __init__(self, endpoint: str | None, workspace: str | None, approval_timeout: float | None) -> None:
        self.endpoint = endpoint
        self.workspace = workspace
        self.approval_timeout = approval_timeout
        self._client: AsyncClient | None = None
        self._lock = anyio.Lock()

    async def client(self, session: ServerSession) -> AsyncClient:
        async with self._lock:
            if self._client is None:
                workspace = self.workspace or await _workspace_from_roots(session)
                client = AsyncClient(self.endpoint, client_name="toolctl-mcp", workspace=workspace)
                client.connect()
                await client.hello()
                self._client = client
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    async def list_tools(self, session: ServerSession) -> list[types.Tool]:
        definitions = await (await self.client(session)).tools()
        return [mcp_tool(d) for d in definitions if isinstance(d, ToolDefinition)]

    async def call_tool(
        self, session: ServerSession, name: str, arguments: dict[str, Any], progress_token: Any
    ) -> types.CallToolResult:
        client = await self.client(session)
        asking = Asking()
        streamed = 0

        async def on_event(event: DaemonMessage) -> None:
            nonlocal streamed
            if isinstance(event, OutputChunk) and progress_token is not None:
                streamed += len(event.data)
                await session.send_progress_notification(progress_token, float(streamed), message=event.data)

        async def on_confirm(request: ConfirmationRequested) -> Decision | None:
            asking.asked = True
            if not _can_elicit(session):
                asking.answers.append("left to an approver (toolctl watch or toolctl approve)")
                return None
            network = all(item.name == "network" for item in request.calls)
            answer = await session.elicit(_approval_message(request), _NETWORK_SCHEMA if network else _APPROVAL_SCHEMA)
            if answer.action == "accept":
                content = answer.content or {}
                remember = content.get("remember_for_session") is True  # a real boolean only
                always = network and content.get("remember_for_workspace") is True
                asking.answers.append("approved through MCP elicitation" + (" for this workspace" if always else ""))
                if remember or always:
                    return Decision("approve_all", remember_for_session=remember, remember_for_workspace=always)
                return APPROVE_ALL
            asking.answers.append(f"{answer.action}d through MCP elicitation")
            return DENY_ALL

        result = await client.call(
            name,
            arguments,
            on_event=on_event if progress_token is not None else None,  # else: results only, fewer frames
            on_confirm=on_confirm,
            approval_timeout=self.approval_timeout,
            cancel_on_abandon=True,
        )
        return mcp_result(result, asking)


def mcp_tool(definition: ToolDefinition) -> types.Tool:
    """A daemon tool as MCP lists it, with hints from its risk and side effects."""
    return types.Tool(
        name=definition.name,
        description=definition.description,
        inputSchema=definition.parameters,
        outputSchema=definition.data_schema or None,
        annotations=types.ToolAnnotations(
            readOnlyHint=not definition.side_effecting,
            destructiveHint=definition.side_effecting and definition.risk != "low",
            openWorldHint=definition.open_world,
        ),
    )


def mcp_result(result: ToolResult, asking: Asking) -> types.CallToolResult:
    """The result as MCP content: text (with how an approval went), ``data`` as structured content."""
    text = result.content
    if asking.asked:
        how = "; ".join(asking.answers) or "answered by an approver"
        text += f"\n[approval was asked: {how}; {_verdict(result)}]"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=result.data if result.ok and result.data is not None else None,
        isError=not result.ok,
    )


def _verdict(result: ToolResult) -> str:
    if result.error is not None and result.error.code == "CONFIRMATION_TIMEOUT":
        return "nobody answered before the approval timeout"
    if result.error is not None and result.error.type == "Denied":
        return "denied"
    return "approved"


_APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "remember_for_session": {
            "type": "boolean",
            "title": "Allow the same again for this session",
            "default": False,
        }
    },
}

#: A command's new network host: also "always, in this workspace" (stored by the daemon).
_NETWORK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_APPROVAL_SCHEMA["properties"],
        "remember_for_workspace": {
            "type": "boolean",
            "title": "Always allow this host in this workspace",
            "default": False,
        },
    },
}


def _approval_message(request: ConfirmationRequested) -> str:
    """What the person reads before answering. Summaries, names and reasons come from
    the model and the workspace (a file name may hold a newline and a fake line): each
    is made one line without control characters; diff lines stay indented below it."""
    lines = ["toold asks before running:"]
    for item in request.calls:
        lines.append(f"- {_one_line(item.summary)} ({_one_line(item.name)}, risk {item.risk})")
        lines.extend(f"  {_one_line(reason)}" for reason in item.reasons)
        if item.diff:
            lines.extend(f"    {_one_line(line)}" for line in item.diff.splitlines()[:40])
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return sanitize_for_terminal(text).replace("\n", "\u23ce")


def _can_elicit(session: ServerSession) -> bool:
    return session.check_client_capability(types.ClientCapabilities(elicitation=types.ElicitationCapability()))


async def _workspace_from_roots(session: ServerSession) -> str | None:
    """The client's first ``file://`` root, if it offers roots."""
    if not session.check_client_capability(types.ClientCapabilities(roots=types.RootsCapability())):
        return None
    try:
        with anyio.fail_after(10):
            roots = (await session.list_roots()).roots
    except Exception:  # a client that declares roots but cannot list them: no workspace
        return None
    for root in roots:
        parsed = urlparse(str(root.uri))
        if parsed.scheme == "file" and parsed.path:
            return unquote(parsed.path)
    return None


def build_server(bridge: Bridge) -> Server[Any, Any]:
    server: Server[Any, Any] = Server(SERVER_NAME, version=_version())

    @server.list_tools()  # type: ignore[no-untyped-call,untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return await bridge.list_tools(server.request_context.session)

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]  # the daemon validates (BadArgs)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        context = server.request_context
        token = context.meta.progressToken if context.meta is not None else None
        return await bridge.call_tool(context.session, name, arguments, token)

    return server


async def serve_stdio(endpoint: str | None, workspace: str | None, approval_timeout: float | None) -> None:
    bridge = Bridge(endpoint, os.path.abspath(workspace) if workspace else None, approval_timeout)
    server = build_server(bridge)
    try:
        async with stdio_server() as (read_stream, write_stream), anyio.create_task_group() as group:
            inbound, outbound = _conforming(group, read_stream, write_stream)
            await server.run(inbound, outbound, server.create_initialization_options())
            group.cancel_scope.cancel()
    finally:
        bridge.close()


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


def _version() -> str:
    try:
        return importlib.metadata.version("toold-client")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(endpoint: str | None, workspace: str | None, approval_timeout: float | None) -> int:
    anyio.run(serve_stdio, endpoint, workspace, approval_timeout)
    print("toolctl mcp: the MCP client closed the session", file=sys.stderr)
    return 0
