"""``toolctl mcp`` served with the MCP SDK's 2.x line.

The 2.x low-level ``Server`` takes its handlers at construction and hands each a
request context. It serves two eras of the protocol on one connection, as the client's
first request decides:

- the handshake era (``initialize``; every 1.x client, and 2.x clients talking to older
  servers): the server may send the client requests, so approvals are asked with
  ``elicitation/create`` and workspaces come from ``roots/list``, as on the 1.x line;
- the 2026-07-28 era, which has no requests from server to client: a call that needs an
  answer ends with an ``input_required`` result carrying the elicitation and an opaque
  ``request_state``; the client asks the person and calls again with the answer. The
  daemon's batch runs on in between (a ``Flight``), so the retry picks up exactly where
  the first leg stopped.

The SDK is reached through ``importlib`` (``Any``): the type checker sees the 1.x line.
"""

from __future__ import annotations

import importlib
import math
import secrets
import warnings
from typing import Any

import anyio
import anyio.abc

from ._errors import TooldError
from .mcp_bridge import SERVER_NAME, Bridge, version

_types: Any = importlib.import_module("mcp.types")
_exceptions: Any = importlib.import_module("mcp.shared.exceptions")
_INTERNAL_ERROR = -32603  # JSON-RPC's
_lowlevel: Any = importlib.import_module("mcp.server.lowlevel")
_stdio: Any = importlib.import_module("mcp.server.stdio")

#: How long a call that asked for input waits for the client to call again.
ABANDONED_AFTER_SECONDS = 600.0
_INPUT_KEY = "approval"


class RequestPeer:
    """The client of one request in the handshake era (it may be sent requests)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def can_elicit(self) -> bool:
        return _declares(self.ctx, elicitation=_types.ElicitationCapability())

    async def elicit(self, message: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        answer = await self.ctx.session.elicit_form(message, schema)
        return answer.action, answer.content

    def wants_progress(self) -> bool:
        return _progress_token(self.ctx) is not None

    async def progress(self, done: float, message: str) -> None:
        await self.ctx.session.report_progress(done, None, message)

    async def root_uris(self) -> list[str] | None:
        if not _declares(self.ctx, roots=_types.RootsCapability()) or not self.ctx.session.can_send_request:
            return None
        with warnings.catch_warnings():  # roots are deprecated in the 2026-07-28 era only
            warnings.simplefilter("ignore")
            roots = (await self.ctx.session.list_roots()).roots
        return [str(root.uri) for root in roots]


class Flight:
    """A call of the 2026-07-28 era running in the daemon across the client's retries:
    what it asks goes out as ``input_required``, the answer comes back with the retry."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx  # the leg being served now (progress goes to it)
        self.events_send, self.events = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)
        self.answers_send, self.answers = anyio.create_memory_object_stream[tuple[str, dict[str, Any] | None]](1)
        self.scope = anyio.CancelScope()


class FlightPeer:
    """The client of a flight: it is never sent a request, only results."""

    def __init__(self, flight: Flight) -> None:
        self.flight = flight

    def can_elicit(self) -> bool:
        return _declares(self.flight.ctx, elicitation=_types.ElicitationCapability())

    async def elicit(self, message: str, schema: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
        await self.flight.events_send.send(("ask", (message, schema)))
        with anyio.move_on_after(ABANDONED_AFTER_SECONDS):
            return await self.flight.answers.receive()
        return "cancel", None  # the client never called again

    def wants_progress(self) -> bool:
        return True  # each leg decides: report_progress is a no-op without its token

    async def progress(self, done: float, message: str) -> None:
        await self.flight.ctx.session.report_progress(done, None, message)

    async def root_uris(self) -> list[str] | None:
        return None  # no roots in this era: --workspace or the daemon's roots


class Flights:
    """The calls waiting for a client's retry, by the ``request_state`` they gave it."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.group: anyio.abc.TaskGroup | None = None
        self._waiting: dict[str, Flight] = {}

    async def call(self, ctx: Any, params: Any) -> Any:
        state = getattr(params, "request_state", None)
        if state is None:
            flight = Flight(ctx)
            assert self.group is not None, "serve_stdio binds the task group"
            self.group.start_soon(self._fly, flight, params.name, dict(params.arguments or {}))
        else:
            found = self._waiting.pop(state, None)
            if found is None:
                return _error_result("toold: unknown or expired request_state; call the tool again")
            flight = found
            flight.ctx = ctx
            await flight.answers_send.send(_answer_in(getattr(params, "input_responses", None)))
        try:
            return await self._next_leg(flight)
        except anyio.get_cancelled_exc_class():
            flight.scope.cancel()  # the client cancelled the call: so is the batch
            raise

    async def _next_leg(self, flight: Flight) -> Any:
        kind, payload = await flight.events.receive()
        if kind == "done":
            return payload
        message, schema = payload
        token = secrets.token_urlsafe(24)
        self._waiting[token] = flight
        request = _types.ElicitRequest(params=_types.ElicitRequestFormParams(message=message, requested_schema=schema))
        return _types.InputRequiredResult(input_requests={_INPUT_KEY: request}, request_state=token)

    async def _fly(self, flight: Flight, name: str, arguments: dict[str, Any]) -> None:
        result: Any = None
        with flight.scope:
            try:
                result = await self.bridge.call_tool(FlightPeer(flight), name, arguments)
            except Exception as exc:  # the daemon went away: the client gets an error result
                result = _error_result(f"toold: {exc}")
        for token, waiting in list(self._waiting.items()):
            if waiting is flight:
                del self._waiting[token]
        await flight.events_send.send(("done", result if result is not None else _error_result("toold: cancelled")))


def build_server(bridge: Bridge, flights: Flights) -> Any:
    async def on_list_tools(ctx: Any, params: Any) -> Any:
        """No daemon, or one that refused: a JSON-RPC error with the reason, as on the 1.x
        line (the SDK logs any other exception as a crash, with its traceback)."""
        try:
            return _types.ListToolsResult(tools=await bridge.list_tools(RequestPeer(ctx)))
        except TooldError as exc:
            raise _exceptions.MCPError(_INTERNAL_ERROR, str(exc)) from None

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        """A call that fails outside the tool (the daemon refused the workspace, went away)
        is an error result the model can read, as the 1.x line makes it too."""
        try:
            if ctx.session.can_send_request:  # the handshake era: ask the client directly
                return await bridge.call_tool(RequestPeer(ctx), params.name, dict(params.arguments or {}))
            return await flights.call(ctx, params)
        except Exception as exc:
            return _error_result(str(exc))

    return _lowlevel.Server(SERVER_NAME, version=version(), on_list_tools=on_list_tools, on_call_tool=on_call_tool)


async def serve_stdio(bridge: Bridge) -> None:
    flights = Flights(bridge)
    server = build_server(bridge, flights)
    async with _stdio.stdio_server() as (read_stream, write_stream), anyio.create_task_group() as group:
        flights.group = group
        await server.run(read_stream, write_stream, server.create_initialization_options())
        group.cancel_scope.cancel()


def _declares(ctx: Any, **capability: Any) -> bool:
    return bool(ctx.session.check_client_capability(_types.ClientCapabilities(**capability)))


def _progress_token(ctx: Any) -> Any:
    """The request's progress token (``_meta`` is a mapping on this line)."""
    meta = ctx.meta or {}
    return meta.get("progress_token", meta.get("progressToken")) if isinstance(meta, dict) else None


def _answer_in(responses: Any) -> tuple[str, dict[str, Any] | None]:
    """The person's answer in a retry's ``input_responses`` (anything else: cancel)."""
    answer = (responses or {}).get(_INPUT_KEY)
    if isinstance(answer, _types.ElicitResult):
        return answer.action, answer.content
    return "cancel", None


def _error_result(text: str) -> Any:
    return _types.CallToolResult(content=[_types.TextContent(type="text", text=text)], is_error=True)
