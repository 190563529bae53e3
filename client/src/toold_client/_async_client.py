"""The async client: the surface of ``Client`` for asyncio and trio programs.

Any number of tasks may use one ``AsyncClient`` at once. Only one of them reads the
socket at a time (waiting on its file descriptors, never polling); whatever it reads
goes into the shared ``Inbox``, and it wakes the others to look for their reply or
event there. A task cancelled while it waits leaves nothing behind: its reply, when it
comes, is dropped, and with ``cancel_on_abandon`` its batch is cancelled in the daemon.
"""

from __future__ import annotations

import inspect
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, cast

from toold_protocol import (
    Ack,
    BatchAccepted,
    BatchFinished,
    BatchList,
    BatchStatus,
    BatchSummary,
    ConfirmationRequested,
    ConnectionList,
    DaemonMessage,
    EventMode,
    PolicyExplanation,
    Pong,
    Pruned,
    ServerConnection,
    Stats,
    ToolDefinition,
    ToolList,
    ToolResult,
    Welcome,
    default_endpoint,
    encode,
)

from . import _aio
from . import _requests as requests
from ._client import BatchOutcome
from ._errors import DaemonUnavailable, RequestTimeout
from ._inbox import Inbox, expect
from ._requests import CallSpec, Decision, Request, to_wire
from ._transport import ZmqTransport

T = TypeVar("T")
AsyncEventHandler = Callable[[DaemonMessage], Awaitable[None] | None]
AsyncConfirmHandler = Callable[[ConfirmationRequested], Awaitable[Decision | None] | Decision | None]


class AsyncClient:
    """A connection to a toold daemon for async code: ``async with AsyncClient() as c:``."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        client_name: str = "toold-client",
        timeout: float = 30.0,
        workspace: str | os.PathLike[str] | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.workspace = os.path.abspath(workspace) if workspace else ""
        self.timeout = timeout
        self.client_name = client_name
        #: This process's umask, read once: the daemon makes this client's files with it.
        self._umask = requests.own_umask()
        self._transport: ZmqTransport | None = None
        self._ids = itertools.count(1)
        self._inbox = Inbox(os.getuid())
        self._reading = False
        # Wakes the reading task after another task sent: a send may take ZeroMQ's
        # (edge-triggered) readiness signal for a frame that arrived meanwhile, and the
        # reader, waiting on that descriptor, would never hear of the frame.
        self._kick_read = self._kick_write = -1
        self._arrived: _aio.Event | None = None
        self._welcome: Welcome | None = None
        # Set while one task's hello is on its way: the others wait for it instead of
        # sending their own (a second hello for the same workspace is refused while the
        # first still opens it).
        self._greeting: _aio.Event | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> AsyncClient:
        self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection (``async with`` does this); DaemonUnavailable if there is no daemon."""
        if self._transport is None:
            self._transport = ZmqTransport(self.endpoint)
            self._kick_read, self._kick_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            os.close(self._kick_read)
            os.close(self._kick_write)

    async def hello(self) -> Welcome:
        """Send ``hello`` (opening the workspace); tasks asking at once share one."""
        while self._greeting is not None:  # another task's hello is on its way
            greeting = self._greeting
            await greeting.wait()
            if self._welcome is not None:
                return self._welcome
        self._greeting = greeting = _aio.new_event()
        try:
            greeting_request = requests.hello(self.client_name, self.workspace, self._umask)
            self._welcome = expect(await self._request(greeting_request), Welcome)
        finally:
            self._greeting = None
            greeting.set()  # the waiting tasks go on: with the welcome, or (it failed) to try themselves
        return self._welcome

    async def welcome(self) -> Welcome:
        """The daemon's ``welcome`` (sends ``hello`` on first use)."""
        return self._welcome if self._welcome is not None else await self.hello()

    async def _open_workspace(self) -> None:
        if self.workspace and self._welcome is None:
            await self.hello()

    # ------------------------------------------------------------------ requests

    async def ping(self, timeout: float | None = None) -> float:
        started = time.perf_counter()
        expect(await self._request(requests.ping(), timeout=timeout), Pong)
        return time.perf_counter() - started

    async def tools(self, format: str = "toold") -> list[ToolDefinition] | list[dict[str, Any]]:
        """Tool definitions; with ``format`` openai/anthropic/gemini, that provider's declarations."""
        reply = expect(await self._request(requests.list_tools(format)), ToolList)
        return reply.tools if format == "toold" else reply.formatted

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        call_id: str = "",
        timeout: float | None = None,
        on_event: AsyncEventHandler | None = None,
        on_confirm: AsyncConfirmHandler | None = None,
        approval_timeout: float | None = None,
        cancel_on_abandon: bool = True,
    ) -> ToolResult:
        """Run one tool call and return its result (an error result is returned, not raised)."""
        outcome = await self.submit(
            [CallSpec(name, arguments or {}, call_id)],
            events="all" if on_event is not None else "results",
            timeout=timeout,
            on_event=on_event,
            on_confirm=on_confirm,
            approval_timeout=approval_timeout,
            cancel_on_abandon=cancel_on_abandon,
        )
        return outcome.results[0]

    async def submit(
        self,
        calls: Iterable[CallSpec | Mapping[str, Any]],
        *,
        batch_id: str | None = None,
        on_event: AsyncEventHandler | None = None,
        on_confirm: AsyncConfirmHandler | None = None,
        events: EventMode = "all",
        timeout: float | None = None,
        approval_timeout: float | None = None,
        dry_run: bool = False,
        cancel_on_abandon: bool = False,
    ) -> BatchOutcome:
        """Submit a batch and wait for it to finish. ``on_event`` and ``on_confirm`` may be
        plain functions or coroutines. If the awaiting task is cancelled and
        ``cancel_on_abandon`` is set, the batch is cancelled in the daemon as well."""
        wire_calls = [to_wire(call, index) for index, call in enumerate(calls)]
        await self._open_workspace()
        request = requests.submit(wire_calls, batch_id, events, approval_timeout, dry_run=dry_run, umask=self._umask)
        accepted = expect(await self._request(request, timeout=timeout), BatchAccepted)
        if accepted.outcome is not None:  # a quick batch's outcome may come with its acceptance
            if on_event is not None:
                await _maybe_await(on_event(accepted.outcome))
            return BatchOutcome(accepted.batch_id, accepted.outcome.state, accepted.outcome.results, accepted)
        try:
            finished = await self.wait_batch(
                accepted.batch_id, on_event=on_event, on_confirm=on_confirm, timeout=timeout
            )
        except BaseException as exc:
            if cancel_on_abandon and not isinstance(exc, Exception):  # cancelled, not failed
                self._send_and_forget(requests.cancel(accepted.batch_id))
            raise
        return BatchOutcome(accepted.batch_id, finished.state, finished.results, accepted)

    async def wait_batch(
        self,
        batch_id: str,
        *,
        on_event: AsyncEventHandler | None = None,
        on_confirm: AsyncConfirmHandler | None = None,
        timeout: float | None = None,
    ) -> BatchFinished:
        """Deliver this batch's events until ``batch_finished``; ``timeout`` is per event."""
        names = self._inbox.batch_names(batch_id)
        while True:
            event = cast(DaemonMessage, await self._until(lambda: self._inbox.next_batch_event(names), timeout))
            if on_event is not None:
                await _maybe_await(on_event(event))
            if isinstance(event, ConfirmationRequested) and on_confirm is not None:
                decision = await _maybe_await(on_confirm(event))
                if decision is not None:
                    await self.confirm(event.correlation_id, decision)
            if isinstance(event, BatchFinished):
                self._inbox.forget_batch(names)
                return event

    async def confirm(self, correlation_id: str, decision: Decision) -> None:
        expect(await self._request(requests.confirm(correlation_id, decision)), Ack)

    async def subscribe(self) -> list[ConfirmationRequested]:
        """Become an approver; returns the requests pending now (later: ``next_confirmation``)."""
        self._inbox.confirmations.clear()
        expect(await self._request(requests.subscribe()), Ack)
        pending = list(self._inbox.confirmations)
        self._inbox.confirmations.clear()
        return pending

    async def watch(self) -> list[ConfirmationRequested]:
        """Subscribe as a watcher (see ``Client.watch``); later events come from ``next_event``."""
        self._inbox.watching = True
        pending = await self.subscribe()
        self._inbox.start_watching()
        return pending

    async def next_event(self, timeout: float | None = None) -> DaemonMessage | None:
        queue = self._inbox.watch_queue
        return await self._until_or_none(lambda: queue.popleft() if queue else None, timeout)

    async def next_confirmation(self, timeout: float | None = None) -> ConfirmationRequested | None:
        queue = self._inbox.confirmations
        return await self._until_or_none(lambda: queue.popleft() if queue else None, timeout)

    async def supply_result(self, batch_id: str, call_id: str, content: str, *, ok: bool = True) -> None:
        request = requests.supply_result(batch_id, call_id, content, ok)
        expect(await self._request(request), Ack)

    async def explain(self, name: str, arguments: Mapping[str, Any] | None = None) -> PolicyExplanation:
        await self._open_workspace()
        return expect(await self._request(requests.explain(name, arguments)), PolicyExplanation)

    async def stats(self) -> Stats:
        """What the daemon has done since it started: calls by tool, decision and outcome,
        latency percentiles, and what it holds now (every uid's for root and the daemon's
        own uid, else this uid's)."""
        return expect(await self._request(requests.stats()), Stats)

    async def reload_policy(self) -> None:
        expect(await self._request(requests.reload_policy()), Ack)

    async def cancel(self, batch_id: str) -> None:
        expect(await self._request(requests.cancel(batch_id)), Ack)

    async def get_batch(self, batch_id: str) -> BatchStatus:
        return expect(await self._request(requests.get_batch(batch_id)), BatchStatus)

    async def list_batches(self, limit: int = 100) -> list[BatchSummary]:
        return expect(await self._request(requests.list_batches(limit)), BatchList).batches

    async def list_connections(self, server: str | None = None, limit: int = 100) -> list[ServerConnection]:
        return expect(await self._request(requests.list_connections(server, limit)), ConnectionList).connections

    async def recover(
        self, batch_id: str, action: Literal["resume", "discard"], *, on_event: AsyncEventHandler | None = None
    ) -> BatchFinished | None:
        reply = await self._request(requests.recover(batch_id, action))
        if action == "discard":
            expect(reply, Ack)
            return None
        accepted = expect(reply, BatchAccepted)
        return await self.wait_batch(accepted.batch_id, on_event=on_event)

    async def undo(
        self,
        batch_id: str,
        *,
        force: bool = False,
        on_event: AsyncEventHandler | None = None,
        on_confirm: AsyncConfirmHandler | None = None,
        approval_timeout: float | None = None,
        timeout: float | None = None,
    ) -> BatchOutcome:
        """As ``Client.undo``."""
        request = requests.undo(batch_id, force, "all", approval_timeout)
        accepted = expect(await self._request(request, timeout=timeout), BatchAccepted)
        finished = await self.wait_batch(accepted.batch_id, on_event=on_event, on_confirm=on_confirm, timeout=timeout)
        return BatchOutcome(accepted.batch_id, finished.state, finished.results, accepted)

    async def prune(self, older_than_seconds: float) -> int:
        reply = await self._request(requests.prune(older_than_seconds))
        return expect(reply, Pruned).removed

    # ------------------------------------------------------------------ plumbing

    def _send(self, request: Request) -> int:
        if self._transport is None:
            raise DaemonUnavailable("the client is not connected (use `async with AsyncClient(...)`)")
        request_id = next(self._ids)
        self._transport.send(encode(request.build(request_id)))
        if self._reading:
            try:
                os.write(self._kick_write, b"\0")
            except BlockingIOError:
                pass  # the pipe is full: the reader is woken already
        return request_id

    def _send_and_forget(self, request: Request) -> None:
        """Send without waiting (safe inside a cancelled task); the reply is dropped."""
        try:
            self._inbox.unwanted.add(self._send(request))
        except DaemonUnavailable:
            pass

    async def _request(self, request: Request, *, timeout: float | None = None) -> DaemonMessage:
        request_id = self._send(request)
        limit = timeout if timeout is not None else self.timeout
        try:
            reply = await self._until_or_none(lambda: self._inbox.take_reply(request_id), limit)
        except BaseException:
            self._inbox.unwanted.add(request_id)
            raise
        if reply is None:
            self._inbox.unwanted.add(request_id)
            raise RequestTimeout(f"no reply from the daemon at {self.endpoint} within {limit:g}s")
        return cast(DaemonMessage, reply)

    async def _until(self, take: Callable[[], T | None], timeout: float | None) -> T:
        found = await self._until_or_none(take, timeout)
        if found is None:
            raise RequestTimeout(f"no message from the daemon at {self.endpoint} within {timeout:.3g}s")
        return found

    async def _until_or_none(self, take: Callable[[], T | None], timeout: float | None) -> T | None:
        """Read (or wait for another task to read) until ``take`` finds something; None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (found := take()) is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            await self._next_arrival(remaining)
        return found

    async def _next_arrival(self, timeout: float | None) -> None:
        """Return after new frames were filed (by this task or another) or ``timeout``."""
        if self._arrived is None:
            self._arrived = _aio.new_event()
        if self._reading:
            await _aio.with_timeout(self._arrived.wait(), timeout)
            return
        self._reading = True
        try:
            if not self._drain():
                if self._transport is None:
                    raise DaemonUnavailable("the client connection is closed")
                fds = [*self._transport.fds(), self._kick_read]
                if await _aio.with_timeout(_aio.wait_readable(fds), timeout):
                    self._forget_kicks()
                    self._drain()
        finally:
            self._reading = False
            arrived, self._arrived = self._arrived, _aio.new_event()
            arrived.set()  # everyone waiting looks again; one of them becomes the reader

    def _forget_kicks(self) -> None:
        try:
            while os.read(self._kick_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _drain(self) -> bool:
        """File every frame waiting now (ZeroMQ's descriptor only signals new arrivals)."""
        if self._transport is None:
            raise DaemonUnavailable("the client connection is closed")
        filed = False
        while (frame := self._transport.try_recv()) is not None:
            self._inbox.deliver(frame)
            filed = True
        return filed


async def _maybe_await(value: Awaitable[T] | T) -> T:
    if inspect.isawaitable(value):
        return await value
    return value
