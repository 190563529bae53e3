"""What every request handler of the service shares: the daemon's parts, its tables,
and the two ways to answer a peer."""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import msgspec
import trio

from toold_protocol import Error, ProtocolErrorCode, encode

from ..config import Config
from ..execution.batches import Batch
from ..execution.executor import Executor
from ..mcp import Gateway
from ..policy import planner
from ..policy.confirmations import Confirmations
from ..records.audit import AuditTrail
from ..records.journal import Journal
from ..records.metrics import Metrics
from ..sandbox import Sandbox
from ..sandbox.workspaces import Workspaces
from ..tools.registry import Registry
from .planning_aside import PlanningAside
from .sessions import Session, Sessions

log = logging.getLogger(__name__)

#: What a client is told when handling its request failed on the daemon's side.
INTERNAL_FAILURE = "internal error while handling the request; the daemon keeps running"


class Send(Protocol):
    """Queue ``frame`` for ``peer``; ``flush``: send it now (a batch's last frame)."""

    def __call__(self, peer: bytes, frame: bytes, flush: bool = False) -> None: ...


class Doorbell(Protocol):
    """How the loop's thread, waiting a moment outside the loop, learns that a client
    has something for the daemon."""

    def ringing(self) -> bool:
        """Frames are waiting to be served already. Safe to ask from any task: the
        server's own loop is woken for what this saw."""

    def fileno(self) -> int:
        """Readable once a new frame comes."""


class Shared(msgspec.Struct, eq=False):
    config: Config  # replaced as a whole when the policy is reloaded
    registry: Registry
    sandbox: Sandbox  # the daemon's roots, for sessions without a workspace
    executor: Executor
    send: Send
    sessions: Sessions
    workspaces: Workspaces  # the sessions' workspaces, under today's configuration
    journal: Journal | None = None
    gateway: Gateway | None = None
    config_path: Path | None = None
    batches: collections.OrderedDict[str, Batch] = msgspec.field(default_factory=collections.OrderedDict)
    confirmations: Confirmations = msgspec.field(default_factory=Confirmations)
    nursery: trio.Nursery | None = None
    accepting: bool = True
    daemon_uid: int = msgspec.field(default_factory=os.geteuid)
    audit: AuditTrail = msgspec.field(default_factory=lambda: AuditTrail(None))
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    aside: PlanningAside = msgspec.field(default_factory=PlanningAside)  # costly plans, on threads
    doorbell: Doorbell | None = None  # the clients' door (None: nothing waits outside the loop)

    def sandbox_of(self, session: Session) -> Sandbox:
        return session.sandbox or self.sandbox

    def planner_for(self, session: Session) -> planner.Planner:
        """Plans as this session: its identity, its client name, its grants, today's policy."""
        return planner.Planner(
            self.registry,
            self.sandbox_of(session),
            self.config,
            session.identity,
            session.client_name,
            frozenset(session.grants),
        )

    @property
    def tasks(self) -> trio.Nursery:
        """Where requests start their tasks (bound when the daemon starts serving)."""
        assert self.nursery is not None, "the service's nursery is not bound yet"
        return self.nursery

    def answer_later(self, session: Session, request_id: int | None, work: Callable[[], Awaitable[None]]) -> None:
        """Answer a request from a task of its own (it waits for the journal, or for a
        thread): a failure there is that request's ``INTERNAL`` error, as for a request
        answered at once, never the end of the service's nursery and with it the daemon."""

        async def guarded() -> None:
            try:
                await work()
            except Exception:
                log.exception("request %s of %s failed", request_id, session.session_id)
                self.error(session.peer, request_id, ProtocolErrorCode.INTERNAL, INTERNAL_FAILURE)

        self.tasks.start_soon(guarded)

    def refuses_more_planning(self, session: Session, request_id: int) -> bool:
        """Whether the uid already has as many large requests being planned aside as it may
        (told with ``TOO_MANY_BATCHES``)."""
        uid = session.identity.uid
        if self.aside.admits(uid):
            return False
        waiting = self.aside.waiting(uid)
        self.error(
            session.peer,
            request_id,
            ProtocolErrorCode.TOO_MANY_BATCHES,
            f"uid {uid} already has {waiting} large requests being planned, the most it may",
        )
        return True

    def reply(self, session: Session, message: msgspec.Struct) -> None:
        self.send(session.peer, encode(message))

    def error(
        self, peer: bytes, request_id: int | None, code: ProtocolErrorCode, message: str, **details: object
    ) -> None:
        self.send(peer, encode(Error(id=request_id, code=str(code), message=message, details=details)))

    def may_see(self, session: Session, owner_uid: int) -> bool:
        """A batch is seen by its own uid and by root; another uid's batch looks unknown."""
        return session.identity.uid in (owner_uid, 0)

    def batch_key(self, session: Session, reference: str, *, flush: bool = True) -> str:
        """The batch a reference names: the id this uid chose (``abc`` is ``1000:abc`` for
        uid 1000), else the reference as it is (an id the daemon made, or a full one).
        ``flush=False``: the journal has settled already (``Journal.settled``)."""
        own = own_batch_id(session.identity.uid, reference)
        journal = self.journal
        if own in self.batches or (journal is not None and own != reference and journal.exists(own, flush=flush)):
            return own
        return reference

    def discovery_due(self, session: Session, names: list[str] | None) -> bool:
        """Whether a configured MCP server's tools must be learnt first (with this
        session's identity and workspace): for a listing, or for calls to ``names``."""
        return (
            self.gateway is not None
            and not session.workspace_problem
            and self.config.tools.mode != "disabled"
            and self.gateway.needs_discovery(names)
        )

    def discover_then(self, session: Session, then: Callable[[], None]) -> None:
        """Learn the due servers' tools in the background, then handle the request."""
        assert self.gateway is not None
        gateway = self.gateway

        async def discover() -> None:
            await gateway.discover(session.identity, self.sandbox_of(session))
            then()

        self.tasks.start_soon(discover)


def own_batch_id(uid: int, chosen: str) -> str:
    """A client-chosen batch id in its uid's namespace: ``abc`` → ``1000:abc`` (already
    namespaced ids stay as they are), so one user's id never blocks or reveals another's."""
    prefix = f"{uid}:"
    return chosen if chosen.startswith(prefix) else prefix + chosen
