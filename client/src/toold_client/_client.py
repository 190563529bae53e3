"""The synchronous client: one DEALER connection, one session with the daemon.

Replies are matched to requests by ``id``. Events of batches (``call_started``,
``call_finished``, ...) that arrive while the client waits for something else are
kept per batch and delivered when that batch is waited on, so nothing is lost
whichever order the caller asks in.
"""

from __future__ import annotations

import collections
import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

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

from . import _requests as requests
from ._errors import RequestTimeout
from ._inbox import Inbox, expect
from ._requests import APPROVE_ALL, DENY_ALL, CallSpec, Decision, Request, to_wire
from ._sharing import SharedConnection
from ._transport import Transport, ZmqTransport

__all__ = ["APPROVE_ALL", "DENY_ALL", "BatchOutcome", "CallSpec", "Client", "ConfirmHandler", "Decision"]

EventHandler = Callable[[DaemonMessage], None]
ConfirmHandler = Callable[[ConfirmationRequested], Decision | None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    batch_id: str
    state: str
    results: list[ToolResult]
    accepted: BatchAccepted


class Client:
    """A connection to a toold daemon. Use as a context manager. Threads may share one:
    each waits for its own replies and batches while the others send and receive theirs
    (``_sharing``); a batch's events go to the thread that waits for that batch."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        client_name: str = "toold-client",
        timeout: float = 30.0,
        transport: Transport | None = None,
        workspace: str | os.PathLike[str] | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        # The directory this session works in (an absolute path: the daemon does not know
        # our current directory). Sent with ``hello``, which then comes before any batch.
        self.workspace = os.path.abspath(workspace) if workspace else ""
        self.timeout = timeout
        self.client_name = client_name
        #: This process's umask, read once: the daemon makes this client's files with it.
        self._umask = requests.own_umask()
        self._transport = transport if transport is not None else ZmqTransport(self.endpoint)
        self._ids = itertools.count(1)
        self._inbox = Inbox(os.getuid())
        self._connection = SharedConnection(self._transport, self._inbox)
        self._welcome: Welcome | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._connection.close()

    @property
    def welcome(self) -> Welcome:
        """The daemon's ``welcome`` (sends ``hello`` on first use)."""
        if self._welcome is None:
            self.hello()
        assert self._welcome is not None
        return self._welcome

    def hello(self) -> Welcome:
        self._welcome = expect(self._request(requests.hello(self.client_name, self.workspace, self._umask)), Welcome)
        return self._welcome

    def _open_workspace(self) -> None:
        """A session with a workspace says hello before anything runs (else its calls
        would run in the daemon's roots); a refused workspace raises here."""
        if self.workspace and self._welcome is None:
            self.hello()

    # ------------------------------------------------------------------ requests

    def ping(self, timeout: float | None = None) -> float:
        """Round-trip time in seconds."""
        started = time.perf_counter()
        expect(self._request(requests.ping(), timeout=timeout), Pong)
        return time.perf_counter() - started

    def tools(self, format: str = "toold") -> list[ToolDefinition] | list[dict[str, Any]]:
        """Tool definitions; with ``format`` openai/anthropic/gemini, that provider's declarations."""
        reply = expect(self._request(requests.list_tools(format)), ToolList)
        return reply.tools if format == "toold" else reply.formatted

    def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        call_id: str = "",
        timeout: float | None = None,
        on_confirm: ConfirmHandler | None = None,
        approval_timeout: float | None = None,
    ) -> ToolResult:
        """Run one tool call and return its result (an error result is returned, not raised)."""
        outcome = self.submit(
            [CallSpec(name, arguments or {}, call_id)],
            events="results",
            timeout=timeout,
            on_confirm=on_confirm,
            approval_timeout=approval_timeout,
        )
        return outcome.results[0]

    def submit(
        self,
        calls: Iterable[CallSpec | Mapping[str, Any]],
        *,
        batch_id: str | None = None,
        on_event: EventHandler | None = None,
        on_confirm: ConfirmHandler | None = None,
        events: EventMode = "all",
        timeout: float | None = None,
        approval_timeout: float | None = None,
        dry_run: bool = False,
    ) -> BatchOutcome:
        """Submit a batch and wait for it to finish; ``on_event`` sees every event as it arrives.
        ``on_confirm`` answers confirmation requests (return None to leave one to an approver)."""
        wire_calls = [to_wire(call, index) for index, call in enumerate(calls)]
        self._open_workspace()
        request = requests.submit(wire_calls, batch_id, events, approval_timeout, dry_run=dry_run, umask=self._umask)
        accepted = expect(self._request(request, timeout=timeout), BatchAccepted)
        finished = accepted.outcome  # a quick batch's outcome may come with its acceptance
        if finished is None:
            finished = self.wait_batch(accepted.batch_id, on_event=on_event, on_confirm=on_confirm, timeout=timeout)
        elif on_event is not None:
            on_event(finished)
        return BatchOutcome(accepted.batch_id, finished.state, finished.results, accepted)

    def wait_batch(
        self,
        batch_id: str,
        *,
        on_event: EventHandler | None = None,
        on_confirm: ConfirmHandler | None = None,
        timeout: float | None = None,
    ) -> BatchFinished:
        """Deliver this batch's events until ``batch_finished``. ``timeout`` is per event (None: wait).
        ``batch_id`` may be the id this client chose: the daemon keeps chosen ids in the
        client's uid namespace (``abc`` → ``1000:abc``), and events carry that full id."""
        with self._connection.inbox() as inbox:
            names = inbox.batch_names(batch_id)
        while True:
            event = self._connection.wait_for(lambda inbox: inbox.next_batch_event(names), timeout)
            if event is None:
                raise RequestTimeout(
                    f"no event of batch {batch_id} from the daemon at {self.endpoint} within {timeout:g}s"
                )
            if on_event is not None:  # handlers run outside the connection's lock: they may call the client
                on_event(event)
            if isinstance(event, ConfirmationRequested) and on_confirm is not None:
                decision = on_confirm(event)
                if decision is not None:
                    self.confirm(event.correlation_id, decision)
            if isinstance(event, BatchFinished):
                with self._connection.inbox() as inbox:
                    inbox.forget_batch(names)
                return event

    # ------------------------------------------------------------------ confirmations

    def confirm(self, correlation_id: str, decision: Decision) -> None:
        """Answer a confirmation request (RemoteError NOT_AUTHORIZED if this session may not)."""
        expect(self._request(requests.confirm(correlation_id, decision)), Ack)

    def subscribe(self) -> list[ConfirmationRequested]:
        """Become an approver; returns the requests pending now that this session may answer.
        Later ones arrive through ``next_confirmation``."""
        with self._connection.inbox() as inbox:
            inbox.confirmations.clear()
        expect(self._request(requests.subscribe()), Ack)
        with self._connection.inbox() as inbox:
            pending = list(inbox.confirmations)
            inbox.confirmations.clear()
        return pending

    def watch(self) -> list[ConfirmationRequested]:
        """Subscribe as a watcher: from now on every event of the batches this session may
        see (a ``batch_status`` with id 0 when one starts, then its events and confirmation
        requests) arrives through ``next_event``. Returns the requests pending now."""
        with self._connection.inbox() as inbox:
            inbox.watching = True
        pending = self.subscribe()
        with self._connection.inbox() as inbox:
            inbox.start_watching()
        return pending

    def next_event(self, timeout: float | None = None) -> DaemonMessage | None:
        """The next unsolicited message after ``watch``, or None after ``timeout``."""
        return self._next_from(self._inbox.watch_queue, timeout)

    def next_confirmation(self, timeout: float | None = None) -> ConfirmationRequested | None:
        """The next confirmation request (after ``subscribe``), or None after ``timeout``."""
        return self._next_from(self._inbox.confirmations, timeout)

    def _next_from(self, queue: collections.deque[T], timeout: float | None) -> T | None:
        """Receive until ``queue`` has something (the receive loop fills it), or time is up."""
        return self._connection.wait_for(lambda _: queue.popleft() if queue else None, timeout)

    def supply_result(self, batch_id: str, call_id: str, content: str, *, ok: bool = True) -> None:
        """Parse-only mode: give a pending call its result (``ok=False``: an error result)."""
        request = requests.supply_result(batch_id, call_id, content, ok)
        expect(self._request(request), Ack)

    # ------------------------------------------------------------------ policy

    def explain(self, name: str, arguments: Mapping[str, Any] | None = None) -> PolicyExplanation:
        """What the daemon's policy would decide for this call from this session (nothing runs)."""
        self._open_workspace()
        return expect(self._request(requests.explain(name, arguments)), PolicyExplanation)

    def stats(self) -> Stats:
        """What the daemon has done since it started: calls by tool, decision and outcome,
        latency percentiles, and what it holds now (every uid's for root and the daemon's
        own uid, else this uid's)."""
        return expect(self._request(requests.stats()), Stats)

    def reload_policy(self) -> None:
        """Ask the daemon to reread its policy (administrators: the daemon's uid or root)."""
        expect(self._request(requests.reload_policy()), Ack)

    def cancel(self, batch_id: str) -> None:
        expect(self._request(requests.cancel(batch_id)), Ack)

    def get_batch(self, batch_id: str) -> BatchStatus:
        return expect(self._request(requests.get_batch(batch_id)), BatchStatus)

    def list_batches(self, limit: int = 100) -> list[BatchSummary]:
        """The journal's batches of this uid (root: everyone's), newest first."""
        return expect(self._request(requests.list_batches(limit)), BatchList).batches

    def list_connections(self, server: str | None = None, limit: int = 100) -> list[ServerConnection]:
        """Connections MCP servers made through the egress proxy (or were refused), newest
        first: this uid's servers' (root: everyone's), of ``server`` when given."""
        return expect(self._request(requests.list_connections(server, limit)), ConnectionList).connections

    def recover(
        self, batch_id: str, action: Literal["resume", "discard"], *, on_event: EventHandler | None = None
    ) -> BatchFinished | None:
        """Resume (runs the never-started calls; returns the finished batch) or discard an interrupted batch."""
        reply = self._request(requests.recover(batch_id, action))
        if action == "discard":
            expect(reply, Ack)
            return None
        accepted = expect(reply, BatchAccepted)
        return self.wait_batch(accepted.batch_id, on_event=on_event)

    def undo(
        self,
        batch_id: str,
        *,
        force: bool = False,
        on_event: EventHandler | None = None,
        on_confirm: ConfirmHandler | None = None,
        approval_timeout: float | None = None,
        timeout: float | None = None,
    ) -> BatchOutcome:
        """Put back every path a finished batch changed; the undo is a batch of its own
        (one ``restore_files`` call: its result lists what was restored, the conflicts,
        and the calls nothing can reverse). A path changed since fails it unless ``force``."""
        request = requests.undo(batch_id, force, "all", approval_timeout)
        accepted = expect(self._request(request, timeout=timeout), BatchAccepted)
        finished = self.wait_batch(accepted.batch_id, on_event=on_event, on_confirm=on_confirm, timeout=timeout)
        return BatchOutcome(accepted.batch_id, finished.state, finished.results, accepted)

    def prune(self, older_than_seconds: float) -> int:
        """Delete finished batches older than this from the journal; returns how many."""
        return expect(self._request(requests.prune(older_than_seconds)), Pruned).removed

    # ------------------------------------------------------------------ plumbing

    def _request(self, request: Request, *, timeout: float | None = None) -> DaemonMessage:
        request_id = next(self._ids)
        self._connection.send(encode(request.build(request_id)))
        waited = timeout if timeout is not None else self.timeout
        reply = self._connection.wait_for(lambda inbox: inbox.take_reply(request_id), waited)
        if reply is None:
            raise RequestTimeout(f"no reply from the daemon at {self.endpoint} within {waited:g}s")
        return reply
