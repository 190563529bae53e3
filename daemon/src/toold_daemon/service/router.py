"""The service: what the daemon does with each decoded message.

This package does not know ZeroMQ. It receives ``Inbound`` frames (peer, kernel
identity, bytes), answers through ``send(peer, bytes)``, and starts tasks in the
nursery it is given. Every malformed or unauthorized request gets an ``error`` message
with a ProtocolErrorCode; nothing a client sends can stop it from serving the others.

Where a message is handled: ``router`` (frames, sessions, hello, tool listings,
shutdown), ``running`` (submit, cancel, the batch task), ``confirming`` (confirm,
subscribe, supplied results), ``administration`` (batch status and listings, recover,
undo, prune, policy explain and reload).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import trio

from toold_protocol import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Cancel,
    ClientMessage,
    Confirm,
    DecodeFailure,
    ExplainPolicy,
    GetBatch,
    GetStats,
    Hello,
    IsolationLayer,
    ListBatches,
    ListConnections,
    ListTools,
    Ping,
    Pong,
    ProtocolErrorCode,
    PruneJournal,
    Recover,
    ReloadPolicy,
    SubmitBatch,
    Subscribe,
    SupplyResult,
    ToolList,
    UndoBatch,
    Welcome,
    decode_client_message,
)

from .. import __version__
from ..config import Config
from ..errors import ToolError
from ..execution.executor import Executor
from ..mcp import Gateway
from ..records.audit import AuditTrail
from ..records.journal import Journal
from ..records.metrics import Holding, Metrics
from ..sandbox import Sandbox
from ..sandbox.workspaces import WorkspaceRefused, Workspaces
from ..tools.registry import Registry
from .administration import Administration
from .confirming import ConfirmationFlow
from .ipc import Inbound
from .running import BatchRuns
from .sessions import Session, Sessions, SessionsFull
from .shared import INTERNAL_FAILURE, Doorbell, Send, Shared

log = logging.getLogger(__name__)

#: How long a stopping daemon waits for the batches it cancelled to end.
_CANCELLED_BATCHES_SECONDS = 5.0


class Service:
    def __init__(
        self,
        *,
        config: Config,
        registry: Registry,
        sandbox: Sandbox,
        executor: Executor,
        send: Send,
        forget: Callable[[bytes], None] | None = None,
        isolation: list[IsolationLayer] | None = None,
        journal: Journal | None = None,
        config_path: Path | None = None,
        gateway: Gateway | None = None,
        audit: AuditTrail | None = None,
        audit_dropped: Callable[[], int] | None = None,
        waiting_for_clients: Callable[[], dict[int, int]] | None = None,
        doorbell: Doorbell | None = None,
    ) -> None:
        self.isolation = isolation or []
        self._audit_dropped = audit_dropped or (lambda: 0)
        self._waiting_for_clients = waiting_for_clients or dict
        self._forget = forget or (lambda peer: None)
        sessions = Sessions(config.daemon.max_sessions, config.daemon.max_sessions_per_uid, self._evicted)
        self.shared = Shared(
            config=config,
            registry=registry,
            sandbox=sandbox,
            executor=executor,
            send=send,
            sessions=sessions,
            workspaces=Workspaces(config, sandbox),
            journal=journal,
            gateway=gateway,
            config_path=config_path,
            audit=audit or AuditTrail(None),
            metrics=Metrics(self._holding),
            doorbell=doorbell,
        )
        self.confirming = ConfirmationFlow(self.shared)
        self.runs = BatchRuns(self.shared, self.confirming)
        executor.runner.spin_only_when(self.runs.serves_one_batch_alone)
        self.admin = Administration(self.shared, self.runs)

    @property
    def sessions(self) -> Sessions:
        return self.shared.sessions

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        self.shared.nursery = nursery
        nursery.start_soon(self.runs.held.send_when_due)

    async def finish_interrupted_undos(self) -> list[str]:
        """Finish the undos the last daemon died in (at start, before serving)."""
        return await self.admin.finish_interrupted_undos()

    def reload_policy(self) -> str | None:
        """Reread ``[tools.approval]`` (SIGHUP); None, or why the old policy stays."""
        return self.admin.reload_policy()

    def _holding(self) -> Holding:
        """What the daemon holds right now, for ``toolctl stats`` and the metrics file."""
        holding = Holding(audit_dropped=self._audit_dropped(), waiting_for_clients=self._waiting_for_clients())
        for batch in self.shared.batches.values():
            if not batch.done.is_set():
                uid = batch.identity.uid
                holding.running_batches[uid] = holding.running_batches.get(uid, 0) + 1
        for session in self.shared.sessions:
            uid = session.identity.uid
            holding.sessions[uid] = holding.sessions.get(uid, 0) + 1
        for pending in self.shared.confirmations.pending.values():
            uid = pending.owner.uid
            holding.confirmations_waiting[uid] = holding.confirmations_waiting.get(uid, 0) + 1
        runner = self.shared.executor.runner  # the confined runner has workers and zygotes
        workers = getattr(runner, "workers", None)
        holding.workers = workers.live if workers is not None else 0
        holding.zygotes = getattr(runner, "zygotes_alive", 0)
        if self.shared.journal is not None:
            holding.journal_bytes = self.shared.journal.size()
            holding.journal_backlog_bytes = self.shared.journal.backlog_bytes()
            holding.journal_pruned_for_space = self.shared.journal.pruned_for_space
        return holding

    def _evicted(self, session: Session) -> None:
        """An idle session made room for a new one: forget everything about its peer."""
        self.shared.confirmations.approvers.pop(session.peer, None)
        self._forget(session.peer)
        self.shared.executor.reads.forget(session.session_id)

    # ------------------------------------------------------------------ entry point

    def handle(self, inbound: Inbound) -> None:
        if inbound.frame is None:
            self._disconnected(inbound.peer, overflowed=inbound.overflowed)
            return
        daemon = self.shared.config.daemon
        if inbound.parts != 1:
            self.shared.error(
                inbound.peer,
                None,
                ProtocolErrorCode.MULTIPART_NOT_ALLOWED,
                f"expected one frame per message, got {inbound.parts}",
            )
            return
        if len(inbound.frame) > daemon.max_frame_bytes:
            self.shared.error(
                inbound.peer,
                None,
                ProtocolErrorCode.FRAME_TOO_LARGE,
                f"frame of {len(inbound.frame)} bytes is over the {daemon.max_frame_bytes}-byte limit",
                limit=daemon.max_frame_bytes,
            )
            return
        try:
            message = decode_client_message(inbound.frame)
        except DecodeFailure as exc:
            self.shared.error(inbound.peer, exc.request_id, exc.code, exc.message)
            return
        try:
            session = self.shared.sessions.seen(inbound.peer, inbound.identity)
        except SessionsFull as exc:
            self.shared.error(inbound.peer, None, ProtocolErrorCode.TOO_MANY_SESSIONS, str(exc))
            return
        try:
            self._dispatch(session, message)
        except Exception:
            log.exception("request %s from %s failed", type(message).__name__, session.session_id)
            self.shared.error(
                session.peer,
                getattr(message, "id", None),
                ProtocolErrorCode.INTERNAL,
                INTERNAL_FAILURE,
            )

    def _disconnected(self, peer: bytes, *, overflowed: str = "") -> None:
        """The peer closed its socket, or stopped reading (``overflowed``): end its session.

        ``on_client_disconnect = "cancel"`` cancels the batches it submitted that have not
        finished (their commands are killed, pending confirmations denied); ``"finish"``
        lets them run. Either way the results are journaled and ``get_batch`` serves them.
        """
        session = self.shared.sessions.end(peer)
        self.shared.confirmations.approvers.pop(peer, None)
        for batch in self.shared.batches.values():  # its id may come back as another client's
            if not batch.done.is_set() and batch.listeners:
                batch.listeners = [(listener, every) for listener, every in batch.listeners if listener != peer]
        if session is None:
            return
        session.deferred.clear()  # submissions waiting on the journal: nobody to answer
        self.shared.executor.reads.forget(session.session_id)
        why = "stopped reading its events" if overflowed else "disconnected"
        if self.shared.config.daemon.on_client_disconnect == "cancel":
            for batch in self.shared.batches.values():
                if batch.session_id == session.session_id and not batch.done.is_set():
                    batch.cancel(f"the client {why}")
        if overflowed:
            self.shared.error(
                peer,
                None,
                ProtocolErrorCode.BACKLOG_OVERFLOW,
                f"{overflowed}; its queued events were dropped and its session ended "
                "(results stay available by get_batch)",
            )

    def _dispatch(self, session: Session, message: ClientMessage) -> None:
        """Where each request is handled: the session's own requests here, batches in
        ``running``, confirmations in ``confirming``, the rest in ``administration``."""
        runs, confirming, admin = self.runs, self.confirming, self.admin
        match message:
            case Ping():
                self.shared.reply(session, Pong(id=message.id))
            case GetStats():
                everyone = session.identity.uid in (0, self.shared.daemon_uid)
                self.shared.reply(
                    session, self.shared.metrics.snapshot(message.id, None if everyone else session.identity.uid)
                )
            case Hello():
                self._hello(session, message)
            case ListTools():
                self._list_tools(session, message)
            case SubmitBatch():
                runs.submit(session, message)
            case Cancel():
                runs.cancel(session, message)
            case Confirm():
                confirming.answer(session, message)
            case Subscribe():
                confirming.subscribe(session, message)
            case SupplyResult():
                confirming.supply(session, message)
            case GetBatch():
                admin.get_batch(session, message)
            case ListBatches():
                admin.list_batches(session, message)
            case ListConnections():
                admin.list_connections(session, message)
            case Recover():
                admin.recover(session, message)
            case UndoBatch():
                admin.undo(session, message)
            case PruneJournal():
                admin.prune(session, message)
            case ExplainPolicy():
                admin.explain(session, message)
            case ReloadPolicy():
                admin.reload(session, message)

    def _hello(self, session: Session, message: Hello) -> None:
        if message.protocol_version < MIN_PROTOCOL_VERSION:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.PROTOCOL_VERSION_UNSUPPORTED,
                f"protocol version {message.protocol_version} is older than {MIN_PROTOCOL_VERSION}",
                supported=[MIN_PROTOCOL_VERSION, PROTOCOL_VERSION],
            )
            return
        session.protocol_version = min(message.protocol_version, PROTOCOL_VERSION)
        session.client_name = message.client_name
        if message.umask is not None:
            session.umask = message.umask
        if message.workspace:
            session.workspace_problem = "the session's workspace is still being opened; wait for welcome"
            self.shared.tasks.start_soon(self._open_workspace, session, message)
            return
        self._welcome(session, message)

    async def _open_workspace(self, session: Session, message: Hello) -> None:
        """Accept ``message.workspace`` for this session or refuse it (WORKSPACE_REFUSED; the
        session then runs nothing): allowed place first, then the client's own worker must
        open it, as the client."""
        uid, workspaces = session.identity.uid, self.shared.workspaces
        try:
            # On a thread: resolving the place asks its filesystem, which may not answer
            # (an NFS home whose server is gone) and must not hold the event loop meanwhile.
            sandbox = await self.shared.aside.plan(
                uid, functools.partial(workspaces.choose, uid, message.workspace), costly=False
            )
            open_workspace = getattr(self.shared.executor.runner, "open_workspace", None)
            if open_workspace is not None:
                canonical = await open_workspace(session.identity, sandbox)
                settle = functools.partial(workspaces.settle, uid, sandbox, canonical or [])
                sandbox = await self.shared.aside.plan(uid, settle, costly=False)
        except (WorkspaceRefused, ToolError) as exc:
            reason = exc.message if isinstance(exc, ToolError) else str(exc)
            session.workspace_problem = f"workspace refused: {reason}"
            self.shared.error(session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, session.workspace_problem)
            return
        session.sandbox, session.workspace, session.workspace_problem = sandbox, str(sandbox.roots[0]), ""
        self._welcome(session, message)

    def _welcome(self, session: Session, message: Hello) -> None:
        tools = self.shared.config.tools
        self.shared.reply(
            session,
            Welcome(
                id=message.id,
                protocol_version=session.protocol_version,
                daemon_version=__version__,
                session_id=session.session_id,
                identity=session.identity,
                tools_mode=tools.mode,
                roots=[str(r) for r in self.shared.sandbox_of(session).roots],
                isolation=self.isolation,
                limits={
                    "max_tool_calls_per_batch": tools.max_tool_calls_per_batch,
                    "max_tool_args_bytes": tools.max_tool_args_bytes,
                    "max_output_bytes": tools.output.max_bytes,
                    "max_frame_bytes": self.shared.config.daemon.max_frame_bytes,
                    "max_batches_per_session": self.shared.config.daemon.max_batches_per_session,
                },
            ),
        )

    def _list_tools(self, session: Session, message: ListTools, *, discovered: bool = False) -> None:
        if not discovered and self.shared.discovery_due(session, None):
            self.shared.discover_then(session, lambda: self._list_tools(session, message, discovered=True))
            return
        approval = self.shared.config.tools.approval
        advertised = self.shared.config.tools.mode != "disabled" and approval.enabled
        # a tool the policy refuses outright is not offered to a model
        hidden = set(approval.denylist)
        definitions = [d for d in self.shared.registry.definitions() if d.name not in hidden] if advertised else []
        formatted = (
            self.shared.registry.export(message.format, hidden=hidden)
            if advertised and message.format != "toold"
            else []
        )
        self.shared.reply(
            session, ToolList(id=message.id, format=message.format, tools=definitions, formatted=formatted)
        )

    async def shutdown(self, grace_seconds: float) -> None:
        """Stop accepting; let running batches finish for ``grace_seconds``, then cancel them."""
        self.shared.accepting = False
        running = [b for b in self.shared.batches.values() if not b.done.is_set()]
        with trio.move_on_after(grace_seconds):
            for batch in running:
                await batch.done.wait()
        for batch in running:
            batch.cancel("the daemon is shutting down")
        # A cancelled batch ends within milliseconds; one that never got its task (a bug
        # in accepting it) never would, and must not keep the daemon from stopping.
        with trio.move_on_after(_CANCELLED_BATCHES_SECONDS) as waiting:
            for batch in running:
                await batch.done.wait()
        if waiting.cancelled_caught:
            stuck = [b.batch_id for b in running if not b.done.is_set()]
            log.error("stopping without waiting for batches that did not end when cancelled: %s", ", ".join(stuck))
