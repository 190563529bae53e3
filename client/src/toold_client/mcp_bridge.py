"""``toolctl mcp``: the daemon's tools offered to any MCP client over stdio.

Each ``tools/call`` becomes a one-call batch in the daemon, so the policy, approvals,
journal and confinement apply as to every other client. When the daemon asks for
approval, the person is asked through MCP elicitation if the client supports it
(accept approves, decline or cancel denies); otherwise an approver (``toolctl watch``,
``toolctl approve``) decides until the approval timeout. Output chunks become progress
notifications when the request carries a progress token; a cancelled request cancels
the batch. The session's workspace is ``--workspace``, else the client's first
``file://`` root, else the daemon's roots.

This module is the bridge's side toward the daemon, the same for both lines of the
MCP SDK; ``_mcp_v1`` and ``_mcp_v2`` serve it with the SDK that is installed (the 1.x
line's decorators, or the 2.x line's handlers, which also speak the 2026-07-28
protocol, where a server asks for input by answering ``input_required``).

Needs the MCP SDK: ``pip install 'toold-client[mcp]'``.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import anyio
from mcp import types

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


class Peer(Protocol):
    """The MCP client of one request, as the bridge needs it (each SDK line provides one)."""

    def can_elicit(self) -> bool: ...

    async def elicit(self, message: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        """Ask the person; (action: accept, decline or cancel; the form's content)."""
        ...

    def wants_progress(self) -> bool: ...

    async def progress(self, done: float, message: str) -> None: ...

    async def root_uris(self) -> list[str] | None:
        """The client's roots, or None when it offers none."""
        ...


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

    async def client(self, peer: Peer) -> AsyncClient:
        async with self._lock:
            if self._client is None:
                workspace = self.workspace or await _workspace_from_roots(peer)
                client = AsyncClient(self.endpoint, client_name="toolctl-mcp", workspace=workspace)
                client.connect()
                await client.hello()
                self._client = client
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    async def list_tools(self, peer: Peer) -> list[types.Tool]:
        definitions = await (await self.client(peer)).tools()
        return [mcp_tool(d) for d in definitions if isinstance(d, ToolDefinition)]

    async def call_tool(self, peer: Peer, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        client = await self.client(peer)
        asking = Asking()
        streamed = 0

        async def on_event(event: DaemonMessage) -> None:
            nonlocal streamed
            if isinstance(event, OutputChunk):
                streamed += len(event.data)
                await peer.progress(float(streamed), event.data)

        async def on_confirm(request: ConfirmationRequested) -> Decision | None:
            asking.asked = True
            if not peer.can_elicit():
                asking.answers.append("left to an approver (toolctl watch or toolctl approve)")
                return None
            network = all(item.name == "network" for item in request.calls)
            action, content = await peer.elicit(
                _approval_message(request), _NETWORK_SCHEMA if network else _APPROVAL_SCHEMA
            )
            if action == "accept":
                content = content or {}
                remember = content.get("remember_for_session") is True  # a real boolean only
                always = network and content.get("remember_for_workspace") is True
                asking.answers.append("approved through MCP elicitation" + (" for this workspace" if always else ""))
                if remember or always:
                    return Decision("approve_all", remember_for_session=remember, remember_for_workspace=always)
                return APPROVE_ALL
            asking.answers.append(f"{action}d through MCP elicitation")
            return DENY_ALL

        result = await client.call(
            name,
            arguments,
            on_event=on_event if peer.wants_progress() else None,  # else: results only, fewer frames
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


async def _workspace_from_roots(peer: Peer) -> str | None:
    """The client's first ``file://`` root, if it offers roots."""
    try:
        with anyio.fail_after(10):
            uris = await peer.root_uris()
    except Exception:  # a client that declares roots but cannot list them: no workspace
        return None
    for uri in uris or []:
        parsed = urlparse(uri)
        if parsed.scheme == "file" and parsed.path:
            return unquote(parsed.path)
    return None


def sdk_line() -> int:
    """The installed MCP SDK's major version."""
    return int(importlib.metadata.version("mcp").split(".")[0])


def version() -> str:
    try:
        return importlib.metadata.version("toold-client")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
