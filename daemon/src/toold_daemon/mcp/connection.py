"""The client side of one MCP stdio connection: JSON-RPC 2.0, one JSON object per line.

Everything the server sends is untrusted: a line longer than ``MAX_LINE_BYTES``, text
that is not a JSON object, or a message that is neither a response, a request nor a
notification ends the connection (``ServerBroken``), and every request still waiting
fails with the reason. Responses to ids we never sent are dropped. The server's own
requests get an answer from ``on_request`` (``ping``, ``roots/list``) or "method not
found"; its notifications go to ``on_notification``.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

MAX_LINE_BYTES = 16 * 1024 * 1024
SEND_TIMEOUT_SECONDS = 10.0
METHOD_NOT_FOUND = -32601

RequestHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any] | None]]
NotificationHandler = Callable[[str, dict[str, Any]], None]


class ServerBroken(Exception):
    """The connection is over: the server exited, closed its end or sent garbage."""


class ServerError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Waiting(msgspec.Struct):
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    reply: dict[str, Any] | None = None
    broken: str = ""


class Connection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        on_request: RequestHandler,
        on_notification: NotificationHandler,
    ) -> None:
        self._stream = stream
        self._on_request = on_request
        self._on_notification = on_notification
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        self._send_lock = trio.Lock()
        self.broken = ""  # why the connection ended ("" while it serves)

    async def request(self, method: str, params: dict[str, Any], *, timeout: float = math.inf) -> dict[str, Any]:
        """Send a request and wait for its result; ``ServerError`` for an error reply,
        ``ServerBroken`` if the connection ends first, ``trio.TooSlowError`` past ``timeout``.
        A cancelled or timed-out request is cancelled at the server too."""
        if self.broken:
            raise ServerBroken(self.broken)
        request_id = next(self._ids)
        waiting = self._waiting[request_id] = _Waiting()
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            with trio.fail_after(timeout):
                await waiting.done.wait()
        except BaseException:
            if not waiting.done.is_set() and not self.broken:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await self.notify("notifications/cancelled", {"requestId": request_id, "reason": "cancelled"})
            raise
        finally:
            self._waiting.pop(request_id, None)
        if waiting.broken:
            raise ServerBroken(waiting.broken)
        reply = waiting.reply or {}
        error = reply.get("error")
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise ServerError(code if isinstance(code, int) else 0, str(message or error)[:2000])
        result = reply.get("result")
        if not isinstance(result, dict):
            raise ServerError(0, "the server's result is not an object")
        return result

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def _send(self, message: dict[str, Any]) -> None:
        """Write one whole line, whatever cancels the caller: a line cut off half way
        would run into the next message and garble both. A server that takes nothing
        for ``SEND_TIMEOUT_SECONDS`` is taken for broken."""
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        try:
            async with self._send_lock:
                if self.broken:
                    raise ServerBroken(self.broken)
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(SEND_TIMEOUT_SECONDS) as writing:
                        await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.fail(f"the server closed its input ({type(exc).__name__})")
            raise ServerBroken(self.broken) from None
        if writing.cancelled_caught:
            self.fail(f"the server read none of its input for {SEND_TIMEOUT_SECONDS:g} s")
            raise ServerBroken(self.broken)
        await trio.lowlevel.checkpoint_if_cancelled()  # the caller's cancellation, now the line is out

    async def read_forever(self) -> None:
        """Read and dispatch until the server's output ends or it sends garbage; then
        every waiting request fails. Runs as the connection's one reader task."""
        buffer = bytearray()
        try:
            while not self.broken:
                data = await self._stream.receive_some(65536)
                if not data:
                    self.fail("the server exited or closed its output")
                    return
                buffer += data
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        await self._dispatch(line)
                if len(buffer) > MAX_LINE_BYTES:
                    self.fail(f"the server sent a line over {MAX_LINE_BYTES} bytes")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.fail(f"the server's output failed ({type(exc).__name__})")
        except ServerBroken:
            pass

    async def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self.fail(f"the server sent a line that is not JSON: {_shown(line)}")
            raise ServerBroken(self.broken) from None
        if not isinstance(message, dict):
            self.fail(f"the server sent JSON that is not a message object: {_shown(line)}")
            raise ServerBroken(self.broken)
        method = message.get("method")
        if isinstance(method, str):
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if "id" in message:
                await self._answer(message["id"], method, params)
            else:
                self._on_notification(method, params)
            return
        if "result" in message or "error" in message:
            reply_id = message.get("id")
            waiting = self._waiting.get(reply_id) if isinstance(reply_id, int) else None
            if waiting is not None and not waiting.done.is_set():
                waiting.reply = message
                waiting.done.set()
            return
        self.fail(f"the server sent a message that is neither request nor response: {_shown(line)}")
        raise ServerBroken(self.broken)

    async def _answer(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if not isinstance(request_id, str | int) or isinstance(request_id, bool):
            return
        result = await self._on_request(method, params)
        if result is None:
            reply: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": request_id,
                "error": {"code": METHOD_NOT_FOUND, "message": f"toold's gateway does not offer {method[:100]}"},
            }
        else:
            reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
        await self._send(reply)

    def fail(self, why: str) -> None:
        """End the connection: every waiting request gets ``why``."""
        if self.broken:
            return
        self.broken = why
        for waiting in self._waiting.values():
            waiting.broken = why
            waiting.done.set()


def _shown(line: bytes) -> str:
    text = line[:120].decode("utf-8", "replace")
    return repr(text) + ("…" if len(line) > 120 else "")
