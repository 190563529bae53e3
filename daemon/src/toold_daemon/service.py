"""Sessions and requests: what the daemon does with each decoded message.

This module does not know ZeroMQ. It receives ``Inbound`` frames (peer, kernel
identity, bytes), answers through ``send(peer, bytes)``, and starts batch tasks in the
nursery it is given. Every malformed or unauthorized request gets an ``error``
message with a ProtocolErrorCode; nothing a client sends can stop it from serving
the others.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec
import trio

from toold_protocol import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Ack,
    BatchAccepted,
    BatchFinished,
    BatchList,
    BatchStatus,
    BatchSummary,
    CallFinished,
    CallStarted,
    Cancel,
    ClientMessage,
    Confirm,
    ConfirmationItem,
    ConfirmationRequested,
    DecodeFailure,
    Error,
    ExplainPolicy,
    GetBatch,
    Hello,
    Identity,
    IsolationLayer,
    ListBatches,
    ListTools,
    OutputChunk,
    Ping,
    PlannedCall,
    PolicyExplanation,
    Pong,
    ProtocolErrorCode,
    Pruned,
    PruneJournal,
    Recover,
    ReloadPolicy,
    SubmitBatch,
    Subscribe,
    SupplyResult,
    ToolCall,
    ToolErrorType,
    ToolList,
    ToolResult,
    UndoBatch,
    Welcome,
    decode_client_message,
    encode,
)

from . import __version__, planner, policy, results
from .batches import Batch, PreparedCall
from .config import Config, ConfigError, load_file
from .confirmations import Confirmations, Pending
from .errors import ToolError
from .executor import Executor
from .held_accepts import HeldAccepts
from .ipc import Inbound
from .journal import Journal, fingerprint
from .journal_writer import Commit, JournalWriteFailed
from .mcp import Gateway
from .policy.engine import describe_command
from .registry import Registry
from .sandbox import Sandbox
from .tools import Tool, ToolContext
from .workspaces import WorkspaceRefused, Workspaces

log = logging.getLogger(__name__)


class Send(Protocol):
    """Queue ``frame`` for ``peer``; ``flush``: send it now (a batch's last frame)."""

    def __call__(self, peer: bytes, frame: bytes, flush: bool = False) -> None: ...


_PER_CALL_EVENTS = (CallStarted, CallFinished, OutputChunk)
_TURNS_KEPT = 10_000


@dataclass(slots=True, frozen=True)
class _Submitted:
    """What the journal keeps of a submission besides the batch itself."""

    client_name: str
    turn_id: str | None
    calls: list[ToolCall]
    planned: list[PlannedCall]
    workspace: str


@dataclass(slots=True)
class Session:
    session_id: str
    peer: bytes
    identity: Identity
    client_name: str = ""
    protocol_version: int = PROTOCOL_VERSION
    running: int = 0
    grants: set[str] = field(default_factory=set)  # "allow for this session" answers
    sandbox: Sandbox | None = None  # its workspace's; None: the daemon's roots
    workspace: str = ""  # as accepted (canonical), "" for the daemon's roots
    workspace_problem: str = ""  # why this session may run nothing ("" when it may)


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
    ) -> None:
        self.config = config
        self.gateway = gateway
        self.config_path = config_path
        self.registry = registry
        self.sandbox = sandbox
        self.executor = executor
        self._send = send
        self._forget = forget or (lambda peer: None)
        self.isolation = isolation or []
        self.journal = journal
        self._daemon_uid = os.geteuid()
        self.sessions: dict[bytes, Session] = {}  # least recently seen first
        self.batches: collections.OrderedDict[str, Batch] = collections.OrderedDict()
        self.accepting = True
        self._turns: dict[tuple[int, str], int] = {}
        self.confirmations = Confirmations()
        self._nursery: trio.Nursery | None = None
        self.workspaces = Workspaces(config, sandbox)
        self.held = HeldAccepts()

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self.held.send_when_due)

    def sandbox_of(self, session: Session) -> Sandbox:
        return session.sandbox or self.sandbox

    # ------------------------------------------------------------------ entry point

    def handle(self, inbound: Inbound) -> None:
        if inbound.frame is None:
            self._disconnected(inbound.peer, overflowed=inbound.overflowed)
            return
        daemon = self.config.daemon
        if inbound.parts != 1:
            self._error(
                inbound.peer,
                None,
                ProtocolErrorCode.MULTIPART_NOT_ALLOWED,
                f"expected one frame per message, got {inbound.parts}",
            )
            return
        if len(inbound.frame) > daemon.max_frame_bytes:
            self._error(
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
            self._error(inbound.peer, exc.request_id, exc.code, exc.message)
            return
        session = self._session(inbound)
        if session is None:
            return
        try:
            self._dispatch(session, message)
        except Exception:
            log.exception("request %s from %s failed", type(message).__name__, session.session_id)
            self._error(
                session.peer,
                getattr(message, "id", None),
                ProtocolErrorCode.INTERNAL,
                "internal error while handling the request; the daemon keeps running",
            )

    def _session(self, inbound: Inbound) -> Session | None:
        """The peer's session, created on its first message. ``sessions`` is kept in
        least-recently-seen order: when the table is full the idle session seen longest
        ago makes room (a peer that went away is dropped by the ipc watcher anyway)."""
        session = self.sessions.pop(inbound.peer, None)
        if session is None:
            uid = inbound.identity.uid
            mine = sum(1 for s in self.sessions.values() if s.identity.uid == uid)
            if mine >= self.config.daemon.max_sessions_per_uid and not self._evict_idle_session(uid):
                self._error(
                    inbound.peer,
                    None,
                    ProtocolErrorCode.TOO_MANY_SESSIONS,
                    f"uid {uid} has {mine} sessions with running batches (max_sessions_per_uid)",
                )
                return None
            if len(self.sessions) >= self.config.daemon.max_sessions and not self._evict_idle_session():
                self._error(
                    inbound.peer, None, ProtocolErrorCode.TOO_MANY_SESSIONS, "too many sessions with running batches"
                )
                return None
            session = Session(session_id=secrets.token_hex(8), peer=inbound.peer, identity=inbound.identity)
        self.sessions[inbound.peer] = session
        return session

    def _evict_idle_session(self, uid: int | None = None) -> bool:
        """Drop the idle session seen longest ago (of ``uid`` only, when given)."""
        for peer, session in self.sessions.items():
            if session.running == 0 and (uid is None or session.identity.uid == uid):
                del self.sessions[peer]
                self.confirmations.approvers.pop(peer, None)
                self._forget(peer)
                self.executor.reads.forget(session.session_id)
                return True
        return False

    def _disconnected(self, peer: bytes, *, overflowed: bool = False) -> None:
        """The peer closed its socket, or stopped reading (``overflowed``): end its session.

        ``on_client_disconnect = "cancel"`` cancels the batches it submitted that have not
        finished (their commands are killed, pending confirmations denied); ``"finish"``
        lets them run. Either way the results are journaled and ``get_batch`` serves them.
        """
        session = self.sessions.pop(peer, None)
        self.confirmations.approvers.pop(peer, None)
        if session is None:
            return
        self.executor.reads.forget(session.session_id)
        why = "stopped reading its events" if overflowed else "disconnected"
        if self.config.daemon.on_client_disconnect == "cancel":
            for batch in self.batches.values():
                if batch.session_id == session.session_id and not batch.done.is_set():
                    batch.cancel(f"the client {why}")
        if overflowed:
            self._error(
                peer,
                None,
                ProtocolErrorCode.BACKLOG_OVERFLOW,
                f"more than {self.config.daemon.max_peer_backlog_bytes} bytes waited for this client; "
                "its queued events were dropped and its session ended (results stay available by get_batch)",
            )

    def _dispatch(self, session: Session, message: ClientMessage) -> None:
        match message:
            case Ping():
                self._reply(session, Pong(id=message.id))
            case Hello():
                self._hello(session, message)
            case ListTools():
                self._list_tools(session, message)
            case SubmitBatch():
                self._submit(session, message)
            case Cancel():
                self._cancel(session, message)
            case GetBatch():
                self._get_batch(session, message)
            case ListBatches():
                self._list_batches(session, message)
            case Recover():
                self._recover(session, message)
            case UndoBatch():
                self._undo(session, message)
            case PruneJournal():
                self._prune(session, message)
            case Confirm():
                self._answer(session, message)
            case Subscribe():
                self._subscribe(session, message)
            case ExplainPolicy():
                self._explain(session, message)
            case ReloadPolicy():
                self._reload(session, message)
            case SupplyResult():
                self._supply(session, message)

    # ------------------------------------------------------------------ requests

    def _hello(self, session: Session, message: Hello) -> None:
        if message.protocol_version < MIN_PROTOCOL_VERSION:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.PROTOCOL_VERSION_UNSUPPORTED,
                f"protocol version {message.protocol_version} is older than {MIN_PROTOCOL_VERSION}",
                supported=[MIN_PROTOCOL_VERSION, PROTOCOL_VERSION],
            )
            return
        session.protocol_version = min(message.protocol_version, PROTOCOL_VERSION)
        session.client_name = message.client_name
        if message.workspace:
            assert self._nursery is not None
            session.workspace_problem = "the session's workspace is still being opened; wait for welcome"
            self._nursery.start_soon(self._open_workspace, session, message)
            return
        self._welcome(session, message)

    async def _open_workspace(self, session: Session, message: Hello) -> None:
        """Accept ``message.workspace`` for this session or refuse it (WORKSPACE_REFUSED; the
        session then runs nothing): allowed place first, then the client's own worker must
        open it, as the client."""
        try:
            sandbox = self.workspaces.choose(session.identity.uid, message.workspace)
            open_workspace = getattr(self.executor.runner, "open_workspace", None)
            if open_workspace is not None:
                canonical = await open_workspace(session.identity, sandbox)
                sandbox = self.workspaces.settle(session.identity.uid, sandbox, canonical or [])
        except (WorkspaceRefused, ToolError) as exc:
            reason = exc.message if isinstance(exc, ToolError) else str(exc)
            session.workspace_problem = f"workspace refused: {reason}"
            self._error(session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, session.workspace_problem)
            return
        session.sandbox, session.workspace, session.workspace_problem = sandbox, str(sandbox.roots[0]), ""
        self._welcome(session, message)

    def _welcome(self, session: Session, message: Hello) -> None:
        tools = self.config.tools
        self._reply(
            session,
            Welcome(
                id=message.id,
                protocol_version=session.protocol_version,
                daemon_version=__version__,
                session_id=session.session_id,
                identity=session.identity,
                tools_mode=tools.mode,
                roots=[str(r) for r in self.sandbox_of(session).roots],
                isolation=self.isolation,
                limits={
                    "max_tool_calls_per_batch": tools.max_tool_calls_per_batch,
                    "max_tool_args_bytes": tools.max_tool_args_bytes,
                    "max_output_bytes": tools.output.max_bytes,
                    "max_frame_bytes": self.config.daemon.max_frame_bytes,
                    "max_batches_per_session": self.config.daemon.max_batches_per_session,
                },
            ),
        )

    def _discovery_due(self, session: Session, names: list[str] | None) -> bool:
        """Whether a configured MCP server's tools must be learnt first (with this
        session's identity and workspace): for a listing, or for calls to ``names``."""
        return (
            self.gateway is not None
            and not session.workspace_problem
            and self.config.tools.mode != "disabled"
            and self.gateway.needs_discovery(names)
        )

    def _discover_then(self, session: Session, then: Callable[[], None]) -> None:
        """Learn the due servers' tools in the background, then handle the request."""
        assert self._nursery is not None and self.gateway is not None
        gateway = self.gateway

        async def discover() -> None:
            await gateway.discover(session.identity, self.sandbox_of(session))
            then()

        self._nursery.start_soon(discover)

    def _list_tools(self, session: Session, message: ListTools, *, discovered: bool = False) -> None:
        if not discovered and self._discovery_due(session, None):
            self._discover_then(session, lambda: self._list_tools(session, message, discovered=True))
            return
        advertised = self.config.tools.mode != "disabled"
        definitions = self.registry.definitions() if advertised else []
        formatted = self.registry.export(message.format) if advertised and message.format != "toold" else []
        self._reply(session, ToolList(id=message.id, format=message.format, tools=definitions, formatted=formatted))

    def _submit(
        self, session: Session, message: SubmitBatch, *, discovered: bool = False, trusted: bool = False
    ) -> None:
        """``trusted``: built by the daemon itself (an undo), so internal tools may appear."""
        if not discovered and self._discovery_due(session, [call.name for call in message.calls]):
            self._discover_then(session, lambda: self._submit(session, message, discovered=True))
            return
        if not self.accepting:
            self._error(session.peer, message.id, ProtocolErrorCode.SHUTTING_DOWN, "the daemon is shutting down")
            return
        if session.workspace_problem:
            self._error(session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, session.workspace_problem)
            return
        chosen = own_batch_id(session.identity.uid, message.batch_id) if message.batch_id is not None else None
        if chosen is not None and self._resubmitted(session, message, chosen):
            return
        if session.running >= self.config.daemon.max_batches_per_session:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"this session already runs {session.running} batches",
            )
            return
        uid = session.identity.uid
        running = sum(s.running for s in self.sessions.values() if s.identity.uid == uid)
        if running >= self.config.daemon.max_running_batches_per_uid:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"uid {uid} already runs {running} batches (max_running_batches_per_uid)",
            )
            return
        internal = [c.name for c in message.calls if (t := self.registry.get(c.name)) is not None and t.internal]
        if internal and not trusted:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"{internal[0]} is run by the daemon itself (toolctl undo), not submitted",
            )
            return
        batch_id = chosen or secrets.token_hex(12)
        calls = self._planner(session).plan(message.calls, turn_iteration=self._count_turn(session, message.turn_id))
        if message.dry_run:
            calls = [_marked_dry(call) for call in calls]
        batch = Batch(
            batch_id=batch_id,
            identity=session.identity,
            session_id=session.session_id,
            calls=calls,
            results=[None] * len(calls),
            digest=_digest(message),
            approval_timeout=message.approval_timeout_seconds,
            sandbox=session.sandbox,
            dry_run=message.dry_run,
        )
        planned = [c.planned() for c in calls]
        accepted = BatchAccepted(id=message.id, batch_id=batch_id, calls=planned)
        commit = None
        if self.journal is not None and batch.read_only:
            batch.journaled_at_end = True  # one write when it ends (_journal_ended), nobody waits
        elif self.journal is not None:  # journaled before it is acknowledged
            first = _runs_at_once(batch)
            commit = self.journal.record_batch(
                batch_id=batch_id,
                identity=session.identity,
                client_name=session.client_name,
                turn_id=message.turn_id,
                digest=batch.digest,
                calls=message.calls,
                planned=planned,
                workspace=session.workspace,
                started=first.index if first is not None else None,
                awaited=True,
            )
            if first is not None:
                first.started_recorded = True
        self._remember(batch)
        if commit is None:
            if _answers_quickly(batch, message):
                self.held.hold(batch_id, lambda: self._reply(session, accepted))
            else:
                self._reply(session, accepted)
        ended = _Submitted(session.client_name, message.turn_id, message.calls, planned, session.workspace)
        self._start(session, batch, message.events == "all", accepted=accepted, commit=commit, ended=ended)

    def _resubmitted(self, session: Session, message: SubmitBatch, batch_id: str) -> bool:
        """A batch id this uid used before: answer from the record and never run anything twice.

        The same calls → the recorded plan, then the recorded results (or the live events of
        a batch still running). Different calls → DUPLICATE_BATCH_ID. (Chosen ids live in
        their uid's namespace, so another user's id never lands here.)
        """
        live = self.batches.get(batch_id)
        stored = self.journal.load(batch_id) if live is None and self.journal is not None else None
        if live is None and stored is None:
            return False
        owner = live.identity.uid if live is not None else stored.identity.uid  # type: ignore[union-attr]
        digest = live.digest if live is not None else stored.fingerprint  # type: ignore[union-attr]
        if owner != session.identity.uid or digest != _digest(message):
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.DUPLICATE_BATCH_ID,
                f"batch id {batch_id!r} was already used for different calls",
                batch_id=batch_id,
            )
            return True
        if live is not None:
            self._reply(
                session, BatchAccepted(id=message.id, batch_id=batch_id, calls=[c.planned() for c in live.calls])
            )
            if live.done.is_set():
                self._reply(
                    session, BatchFinished(batch_id=batch_id, state=live.state, results=live.finished_results())
                )
            else:
                live.listeners.append((session.peer, message.events == "all"))
            return True
        assert stored is not None
        if stored.state == "interrupted":
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.BATCH_INTERRUPTED,
                f"batch {batch_id!r} was interrupted by a daemon restart; resume or discard it "
                f"(toolctl recover {batch_id} --resume|--discard)",
                batch_id=batch_id,
            )
            return True
        self._reply(
            session,
            BatchAccepted(
                id=message.id,
                batch_id=batch_id,
                calls=[c.planned(r) for c, r in zip(stored.calls, stored.results, strict=True)],
            ),
        )
        self._reply(
            session,
            BatchFinished(batch_id=batch_id, state=stored.state, results=[r for r in stored.results if r is not None]),
        )
        return True

    def _start(
        self,
        session: Session,
        batch: Batch,
        all_events: bool,
        *,
        accepted: BatchAccepted | None = None,
        commit: Commit | None = None,
        ended: _Submitted | None = None,
    ) -> None:
        """Run ``batch`` in a task of its own. With ``commit``, the batch's record must be
        durable first: only then is ``accepted`` sent and anything run. ``ended``: what
        to journal of a batch journaled when it ends."""
        assert self._nursery is not None
        batch.listeners.append((session.peer, all_events))
        session.running += 1
        self._nursery.start_soon(self._run_batch, session, batch, accepted, commit, ended)

    async def _run_batch(
        self,
        session: Session,
        batch: Batch,
        accepted: BatchAccepted | None,
        commit: Commit | None,
        ended: _Submitted | None,
    ) -> None:
        if commit is not None and not await self._recorded(session, batch, accepted, commit):
            session.running -= 1
            return
        approver_gids = self.config.tools.approval.approver_gids

        def emit(event: msgspec.Struct) -> None:
            final = isinstance(event, BatchFinished)
            if final:
                self.held.release(batch.batch_id)  # the acceptance goes first, in the same flush
            frame = None
            listening = set()
            for peer, all_events in batch.listeners:
                listening.add(peer)
                if all_events or not isinstance(event, _PER_CALL_EVENTS):
                    frame = frame or encode(event)
                    self._send(peer, frame, flush=final)
            if self.confirmations.approvers and not isinstance(event, ConfirmationRequested):
                for peer in self.confirmations.watchers(
                    batch.identity, approver_gids
                ):  # approvers get those on their own
                    if peer not in listening:
                        frame = frame or encode(event)
                        self._send(peer, frame, flush=final)

        # Watchers (subscribed approvers of this uid) learn of the batch, then see its events.
        watchers = self.confirmations.watchers(batch.identity, approver_gids) if self.confirmations.approvers else []
        if any(peer != session.peer for peer in watchers):
            status = BatchStatus(
                id=0,
                batch_id=batch.batch_id,
                state=batch.state,
                calls=[c.planned() for c in batch.calls],
                results=batch.finished_results(),
            )
            for peer in watchers:
                if peer != session.peer:
                    self._send(peer, encode(status))

        try:
            if not batch.dry_run and any(c.needs_confirmation and c.result is None for c in batch.calls):
                await self._confirm_batch(session, batch, emit)
            await self.executor.run(batch, emit)
            if batch.journaled_at_end and ended is not None:
                self._journal_ended(batch, ended)  # no await since it ended: nothing forgot it yet
        except Exception:
            # A failed journal write must not take the daemon down with it; the batch's
            # clients still get every result the executor produced.
            log.exception("batch %s failed outside its tools", batch.batch_id)
            emit(BatchFinished(batch_id=batch.batch_id, state=batch.state, results=batch.finished_results()))
        finally:
            session.running -= 1

    def _journal_ended(self, batch: Batch, submitted: _Submitted) -> None:
        assert self.journal is not None
        self.journal.record_ended(
            batch_id=batch.batch_id,
            identity=batch.identity,
            client_name=submitted.client_name,
            turn_id=submitted.turn_id,
            digest=batch.digest,
            calls=submitted.calls,
            planned=submitted.planned,
            results=batch.results,
            state=batch.state,
            workspace=submitted.workspace,
        )

    async def _recorded(self, session: Session, batch: Batch, accepted: BatchAccepted | None, commit: Commit) -> bool:
        """Wait for the batch's record, then acknowledge it; if the journal cannot take it,
        the batch is refused (nothing ran) and forgotten."""
        try:
            await commit.durable()
        except JournalWriteFailed as exc:
            self.batches.pop(batch.batch_id, None)
            batch.done.set()
            request_id = accepted.id if accepted is not None else None
            self._error(
                session.peer, request_id, ProtocolErrorCode.INTERNAL, f"the journal could not record the batch: {exc}"
            )
            return False
        if accepted is not None:
            self._reply(session, accepted)
        return True

    def _planner(self, session: Session) -> planner.Planner:
        """Plans as this session: its identity, its client name, its grants, today's policy."""
        return planner.Planner(
            self.registry,
            self.sandbox_of(session),
            self.config,
            session.identity,
            session.client_name,
            frozenset(session.grants),
        )

    # ------------------------------------------------------------------ confirmations

    async def _confirm_batch(self, session: Session, batch: Batch, emit: Callable[[msgspec.Struct], None]) -> None:
        """Ask once for every call that needs it, wait for an authorized answer (or the
        timeout, or a cancel), and apply it before anything in the batch runs."""
        approval = self.config.tools.approval
        asked = [c for c in batch.calls if c.needs_confirmation and c.result is None]
        items = [
            ConfirmationItem(
                call_id=c.call_id,
                name=c.name,
                summary=c.summary,
                risk=c.risk,  # type: ignore[arg-type]
                locations=c.locations,
                diff=await self._preview(batch, c),
                arguments=msgspec.to_builtins(c.args),
                reasons=_reasons_for_people(c),
            )
            for c in asked
        ]
        pending = self.confirmations.open(
            batch_id=batch.batch_id,
            owner=batch.identity,
            submitter=session.peer,
            items=items,
            timeout=batch.approval_timeout or approval.timeout_seconds,
        )
        batch.state = "awaiting_confirmation"
        request = ConfirmationRequested(
            batch_id=batch.batch_id,
            correlation_id=pending.correlation_id,
            calls=items,
            expires_in_ms=pending.remaining_ms(),
        )
        emit(request)
        frame = encode(request)
        for peer in self.confirmations.approver_peers(pending, approval.approver_gids):
            self._send(peer, frame)
        try:
            with trio.move_on_at(trio.current_time() + (batch.approval_timeout or approval.timeout_seconds)) as scope:
                batch.current_scope = scope
                if batch.cancel_reason is None:
                    await pending.decided.wait()
        finally:
            batch.current_scope = None
            self.confirmations.close(pending)
        self._apply_answer(session, batch, asked, pending)
        batch.state = "running"

    async def _preview(self, batch: Batch, call: PreparedCall) -> str | None:
        """The diff a person should see before approving an edit (None when there is none,
        or when it cannot be made quickly: a preview never blocks the request)."""
        if call.tool is None:
            return None
        sandbox = batch.sandbox or self.sandbox
        ctx = ToolContext(call_id=call.call_id, sandbox=sandbox, config=self.config, resolved=call.resolved)
        with trio.move_on_after(5):
            try:
                diff = await self.executor.runner.preview(call.tool, call.args, ctx, batch.identity)
            except Exception as exc:  # a failing edit shows why in the request instead of a diff
                return f"[no preview: {type(exc).__name__}: {str(exc)[:300]}]"
            return diff[:50_000] if diff else None
        return None

    def _apply_answer(self, session: Session, batch: Batch, asked: list[PreparedCall], pending: Pending) -> None:
        answer, by = pending.answer, pending.answered_by
        for call in asked:
            if batch.cancel_reason is not None:
                return  # the executor gives every remaining call its Cancelled result
            if answer is None:
                waited = batch.approval_timeout or self.config.tools.approval.timeout_seconds
                call.denial = _unanswered(call, waited)
                continue
            approved = answer.decision == "approve_all" or (
                answer.decision == "approve_selected" and call.call_id in answer.approved_call_ids
            )
            if not approved:
                who = f"uid {by.uid}" if by is not None else "the approver"
                call.denial = _denied(call, f"denied by {who}" + (f": {answer.reason}" if answer.reason else ""))
                continue
            call.needs_confirmation = False
            modified = answer.modified_arguments.get(call.call_id)
            if modified is not None:
                self._planner(session).replan(call, modified)
            if answer.remember_for_session and call.denial is None:
                key = planner.grant_key(call)
                if key:
                    session.grants.add(key)

    def _answer(self, session: Session, message: Confirm) -> None:
        approval = self.config.tools.approval
        pending = self.confirmations.pending.get(message.correlation_id)
        if pending is None or not self.confirmations.may_answer(
            session.peer, session.identity, pending, approval.approver_gids
        ):
            # The same answer whether the id does not exist or belongs to someone else:
            # another user learns nothing about other users' requests.
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.NOT_AUTHORIZED,
                f"no pending confirmation {message.correlation_id[:64]!r} that this session may answer",
            )
            return
        if pending.decided.is_set():
            self._error(session.peer, message.id, ProtocolErrorCode.NOT_AUTHORIZED, "already answered")
            return
        known = {item.call_id for item in pending.items}
        unknown = [c for c in [*message.approved_call_ids, *message.modified_arguments] if c not in known]
        if unknown:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"call ids not in this confirmation: {', '.join(map(repr, unknown[:10]))}",
            )
            return
        pending.answer, pending.answered_by = message, session.identity
        pending.decided.set()
        self._reply(session, Ack(id=message.id))

    def _subscribe(self, session: Session, message: Subscribe) -> None:
        """Become an approver: the pending requests this session may answer come first,
        then the ``ack``; new ones follow as they are made."""
        self.confirmations.subscribe(session.peer, session.identity)
        approval = self.config.tools.approval
        for pending in self.confirmations.visible_to(session.peer, session.identity, approval.approver_gids):
            self._reply(
                session,
                ConfirmationRequested(
                    batch_id=pending.batch_id,
                    correlation_id=pending.correlation_id,
                    calls=pending.items,
                    expires_in_ms=pending.remaining_ms(),
                ),
            )
        self._reply(session, Ack(id=message.id))

    def _supply(self, session: Session, message: SupplyResult) -> None:
        """Parse-only mode: a person's result for a pending call, from the batch's own uid
        (or an approver group). The result is bounded and sanitized like a tool's."""
        batch = self.batches.get(self._batch_key(session, message.batch_id))
        approver_gids = self.config.tools.approval.approver_gids
        allowed = batch is not None and (
            session.identity.uid == batch.identity.uid
            or self.confirmations.may_watch(session.peer, batch.identity, approver_gids)
        )
        if batch is None or not allowed:
            self._error(session.peer, message.id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {message.batch_id!r}")
            return
        call = next((c for c in batch.calls if c.call_id == message.call_id), None)
        if call is None or not call.awaiting_result or call.supplied is not None:
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"call {message.call_id[:128]!r} of batch {message.batch_id!r} is not waiting for a result",
            )
            return
        limits = self.config.tools.output
        if message.ok:
            call.supplied = results.success(
                call.call_id,
                message.content,
                None,
                {"supplied_by_uid": session.identity.uid},
                allow_truncation=True,
                max_bytes=limits.max_bytes,
                max_lines=limits.max_lines,
                duration_ms=0.0,
            )
        else:
            error = ToolError(ToolErrorType.EXECUTION_FAILED, "SUPPLIED_ERROR", message.content[:2000] or "failed")
            call.supplied = results.failure(call.call_id, error)
        call.supplied_event.set()
        self._reply(session, Ack(id=message.id))

    # ------------------------------------------------------------------ policy

    def _explain(self, session: Session, message: ExplainPolicy) -> None:
        call = ToolCall(call_id="explain", name=message.name, arguments=message.arguments)
        decision, reason, risk, rule = self._planner(session).explain(call)
        self._reply(
            session,
            PolicyExplanation(
                id=message.id,
                tool=message.name,
                decision=decision,  # type: ignore[arg-type]
                reason=reason,
                risk=risk,  # type: ignore[arg-type]
                rule=rule,
            ),
        )

    def _reload(self, session: Session, message: ReloadPolicy) -> None:
        if session.identity.uid not in (0, self._daemon_uid):
            self._error(session.peer, message.id, ProtocolErrorCode.NOT_AUTHORIZED, "only an administrator may reload")
            return
        problem = self.reload_policy()
        if problem is not None:
            self._error(session.peer, message.id, ProtocolErrorCode.INVALID_MESSAGE, problem)
            return
        self._reply(session, Ack(id=message.id))

    def reload_policy(self) -> str | None:
        """Swap in ``[tools.approval]`` from the config file, atomically; None on success,
        else why the new policy was refused (the old one stays). Batches already planned
        keep the decisions they were planned with."""
        if self.config_path is None:
            return "the daemon was started without --config; there is no policy file to reload"
        try:
            fresh = load_file(self.config_path)
        except ConfigError as exc:
            log.error("policy reload refused, keeping the old policy: %s", exc)
            return f"policy reload refused, keeping the old policy: {exc}"
        tools = msgspec.structs.replace(self.config.tools, approval=fresh.tools.approval)
        self.config = msgspec.structs.replace(self.config, tools=tools)
        log.info("policy reloaded from %s (%d rules)", self.config_path, len(fresh.tools.approval.rules))
        return None

    def _count_turn(self, session: Session, turn_id: str | None) -> int:
        """How many batches this uid has submitted for ``turn_id`` (1 for this one). Bounded memory:
        the oldest turns are forgotten first."""
        if turn_id is None:
            return 1
        key = (session.identity.uid, turn_id)
        count = self._turns.pop(key, 0) + 1
        self._turns[key] = count
        if len(self._turns) > _TURNS_KEPT:
            del self._turns[next(iter(self._turns))]
        return count

    def _cancel(self, session: Session, message: Cancel) -> None:
        batch = self._owned_batch(session, message.id, message.batch_id)
        if batch is None:
            return
        batch.cancel("cancelled by the client")
        self._reply(session, Ack(id=message.id))

    def _get_batch(self, session: Session, message: GetBatch) -> None:
        """From memory while the daemon knows the batch, else from the journal (after a restart)."""
        key = self._batch_key(session, message.batch_id)
        batch = self.batches.get(key)
        if batch is not None and self._may_see(session, batch.identity.uid):
            self._reply(
                session,
                BatchStatus(
                    id=message.id,
                    batch_id=batch.batch_id,
                    state=batch.state,
                    calls=[c.planned() for c in batch.calls],
                    results=batch.finished_results(),
                ),
            )
            return
        stored = self.journal.load(key) if self.journal is not None and batch is None else None
        if stored is None or not self._may_see(session, stored.identity.uid):
            self._error(session.peer, message.id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {message.batch_id!r}")
            return
        self._reply(
            session,
            BatchStatus(
                id=message.id,
                batch_id=stored.batch_id,
                state=stored.state,
                calls=[c.planned(r) for c, r in zip(stored.calls, stored.results, strict=True)],
                results=[r for r in stored.results if r is not None],
            ),
        )

    def _list_batches(self, session: Session, message: ListBatches) -> None:
        if self.journal is None:
            self._error(session.peer, message.id, ProtocolErrorCode.JOURNAL_DISABLED, "this daemon keeps no journal")
            return
        uid = None if session.identity.uid == 0 else session.identity.uid
        rows = self.journal.summaries(uid=uid, limit=message.limit)
        self._reply(
            session,
            BatchList(
                id=message.id,
                batches=[
                    BatchSummary(
                        batch_id=b,
                        state=self._live_state(b, state),  # type: ignore[arg-type]
                        submitted=submitted,
                        calls=calls,
                        uid=owner,
                    )
                    for b, state, submitted, calls, owner in rows
                ],
            ),
        )

    def _recover(self, session: Session, message: Recover) -> None:
        """Resume (run the never-started calls, under today's policy) or discard an interrupted batch."""
        if self.journal is None:
            self._error(session.peer, message.id, ProtocolErrorCode.JOURNAL_DISABLED, "this daemon keeps no journal")
            return
        key = self._batch_key(session, message.batch_id)
        live = self.batches.get(key)
        stored = self.journal.load(key)
        if stored is None or not self._may_see(session, stored.identity.uid):
            self._error(session.peer, message.id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {message.batch_id!r}")
            return
        if stored.state != "interrupted" or (live is not None and not live.done.is_set()):
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.NOT_INTERRUPTED,
                f"batch {message.batch_id!r} is {stored.state}, not interrupted",
            )
            return
        if message.action == "discard":
            self.journal.discard(stored.batch_id)
            self.batches.pop(stored.batch_id, None)
            self._reply(session, Ack(id=message.id))
            return
        # Planned as the batch's original owner and client, in its workspace, under today's policy.
        try:
            sandbox = self.workspaces.choose(stored.identity.uid, stored.workspace) if stored.workspace else None
        except WorkspaceRefused as exc:
            self._error(session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, f"workspace refused: {exc}")
            return
        owner = planner.Planner(
            self.registry, sandbox or self.sandbox, self.config, stored.identity, stored.client_name
        )
        calls = owner.plan([c.tool_call() for c in stored.calls])
        for call in calls:
            recorded = stored.results[call.index]
            if recorded is None and call.result is not None:
                self.journal.result(stored.batch_id, call.index, call.result)  # refused by today's checks
        batch = Batch(
            batch_id=stored.batch_id,
            identity=stored.identity,
            session_id=session.session_id,
            calls=calls,
            results=list(stored.results),
            digest=stored.fingerprint,
            sandbox=sandbox,
        )
        self.journal.set_state(stored.batch_id, "running")
        self._remember(batch)
        self._reply(
            session,
            BatchAccepted(
                id=message.id,
                batch_id=batch.batch_id,
                calls=[c.planned(r) for c, r in zip(stored.calls, stored.results, strict=True)],
            ),
        )
        self._start(session, batch, all_events=True)

    def _undo(self, session: Session, message: UndoBatch) -> None:
        """Undo a finished batch: one ``restore_files`` call, submitted as a batch of this
        session (journaled, judged by the policy, itself undoable)."""
        if self.journal is None or self.executor.undo is None:
            self._error(session.peer, message.id, ProtocolErrorCode.JOURNAL_DISABLED, "this daemon keeps no journal")
            return
        key = self._batch_key(session, message.batch_id)
        stored = self.journal.load(key)
        if stored is None or not self._may_see(session, stored.identity.uid):
            self._error(session.peer, message.id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {message.batch_id!r}")
            return
        if session.identity.uid not in (stored.identity.uid, 0):
            self._error(
                session.peer, message.id, ProtocolErrorCode.NOT_AUTHORIZED, "only the batch's user or root may undo it"
            )
            return
        live = self.batches.get(key)
        if stored.state not in ("finished", "cancelled") or (live is not None and not live.done.is_set()):
            self._error(
                session.peer,
                message.id,
                ProtocolErrorCode.BATCH_NOT_ENDED,
                f"batch {message.batch_id!r} is {stored.state}: only a batch that has ended can be undone",
            )
            return
        arguments = self.executor.undo.plan(stored, force=message.force, cannot_reverse=self._cannot_reverse)
        base = str(self.sandbox_of(session).working_dir)
        for entry in arguments["entries"]:  # as a model would name them: relative to the workspace
            if entry["path"].startswith(base.rstrip("/") + "/"):
                entry["path"] = os.path.relpath(entry["path"], base)
        call = ToolCall(call_id="undo", name="restore_files", arguments=msgspec.Raw(msgspec.msgpack.encode(arguments)))
        submit = SubmitBatch(
            id=message.id,
            calls=[call],
            events=message.events,
            approval_timeout_seconds=message.approval_timeout_seconds,
        )
        self._submit(session, submit, discovered=True, trusted=True)

    def _cannot_reverse(self, name: str) -> bool:
        """A side-effecting tool that declares no paths it changes: a command, an MCP
        server's tool, daemon state. Its effects are beyond what undo keeps."""
        tool = self.registry.get(name)
        if tool is None:
            return name.startswith("mcp__")
        return tool.side_effecting and type(tool).changes is Tool.changes

    def _prune(self, session: Session, message: PruneJournal) -> None:
        if self.journal is None:
            self._error(session.peer, message.id, ProtocolErrorCode.JOURNAL_DISABLED, "this daemon keeps no journal")
            return
        everyone = session.identity.uid in (0, self._daemon_uid)
        removed = self.journal.prune(
            older_than_seconds=message.older_than_seconds, uid=None if everyone else session.identity.uid
        )
        for batch_id in removed:
            self.batches.pop(batch_id, None)
        self._reply(session, Pruned(id=message.id, removed=len(removed)))

    @staticmethod
    def _may_see(session: Session, owner_uid: int) -> bool:
        return session.identity.uid in (owner_uid, 0)

    def _owned_batch(self, session: Session, request_id: int, batch_id: str) -> Batch | None:
        """The batch, if this session's uid owns it (root may see all). Another uid's batch looks unknown."""
        batch = self.batches.get(self._batch_key(session, batch_id))
        if batch is None or (session.identity.uid not in (batch.identity.uid, 0)):
            self._error(session.peer, request_id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {batch_id!r}")
            return None
        return batch

    def _live_state(self, batch_id: str, recorded: str) -> str:
        """The state of a batch this daemon is running (the journal records only its
        start and end, to keep commits off each call's path)."""
        live = self.batches.get(batch_id)
        return live.state if live is not None and not live.done.is_set() else recorded

    def _batch_key(self, session: Session, reference: str) -> str:
        """The batch a reference names: the id this uid chose (``abc`` is ``1000:abc`` for
        uid 1000), else the reference as it is (an id the daemon made, or a full one)."""
        own = own_batch_id(session.identity.uid, reference)
        if own in self.batches or (self.journal is not None and own != reference and self.journal.exists(own)):
            return own
        return reference

    def _remember(self, batch: Batch) -> None:
        """Keep finished batches for get_batch; beyond the configured count, drop the oldest
        finished ones. Scans only as far as it needs to (this runs on every submit)."""
        self.batches[batch.batch_id] = batch
        excess = len(self.batches) - self.config.daemon.finished_batches_kept
        if excess > 0:
            oldest_done = (b for b, kept in self.batches.items() if kept.done.is_set())
            for batch_id in list(itertools.islice(oldest_done, excess)):
                del self.batches[batch_id]

    # ------------------------------------------------------------------ shutdown

    async def shutdown(self, grace_seconds: float) -> None:
        """Stop accepting; let running batches finish for ``grace_seconds``, then cancel them."""
        self.accepting = False
        running = [b for b in self.batches.values() if not b.done.is_set()]
        with trio.move_on_after(grace_seconds):
            for batch in running:
                await batch.done.wait()
        for batch in running:
            batch.cancel("the daemon is shutting down")
        for batch in running:
            await batch.done.wait()

    # ------------------------------------------------------------------ replies

    def _reply(self, session: Session, message: msgspec.Struct) -> None:
        self._send(session.peer, encode(message))

    def _error(
        self, peer: bytes, request_id: int | None, code: ProtocolErrorCode, message: str, **details: object
    ) -> None:
        self._send(peer, encode(Error(id=request_id, code=str(code), message=message, details=details)))


def _digest(message: SubmitBatch) -> str:
    """What makes a resubmission the same batch: its calls, and whether it is a dry run."""
    digest = fingerprint(message.calls)
    return f"dry:{digest}" if message.dry_run else digest


def _answers_quickly(batch: Batch, message: SubmitBatch) -> bool:
    """One read-only call for a client that wants only the outcome: its acceptance is
    held until it finishes (``HeldAccepts``)."""
    if len(batch.calls) != 1 or message.events != "results" or not batch.read_only:
        return False
    call = batch.calls[0]
    return not call.needs_confirmation and not call.awaiting_result


def _runs_at_once(batch: Batch) -> PreparedCall | None:
    """The batch's first call when it is side-effecting and runs as soon as the batch is
    accepted (nothing to confirm or supply first): its started mark can share the batch's
    journal transaction instead of costing a commit of its own."""
    if batch.dry_run or any(c.needs_confirmation or c.awaiting_result for c in batch.calls):
        return None
    first = next((c for c in batch.calls if c.result is None), None)
    if first is None or first.denial is not None or first.tool is None or not first.tool.side_effecting:
        return None
    return first


def _marked_dry(call: PreparedCall) -> PreparedCall:
    """A dry run's call refused at planning: its result says so in ``data`` too."""
    if call.result is not None:
        policy = "deny" if call.result.error is not None and call.result.error.code == "DENIED_BY_POLICY" else "error"
        data = {**(call.result.data or {}), "dry_run": True, "policy": policy}
        call.result = msgspec.structs.replace(call.result, data=data)
    return call


def _denied(call: PreparedCall, why: str) -> ToolResult:
    return results.failure(
        call.call_id,
        ToolError(ToolErrorType.DENIED, "DENIED_BY_USER", f"Denied: {call.name} was not approved ({why})"),
    )


def _unanswered(call: PreparedCall, waited: float) -> ToolResult:
    """Nobody answered in time: not a person's no, and a caller may want to ask again."""
    return results.failure(
        call.call_id,
        ToolError(
            ToolErrorType.TIMEOUT,
            "CONFIRMATION_TIMEOUT",
            f"Not run: {call.name} needed a confirmation and there was no answer within {waited:g}s",
            waited_seconds=waited,
        ),
    )


def _reasons_for_people(call: PreparedCall) -> list[str]:
    """Why the policy asks; for a shell command also everything it will run."""
    reasons = [call.policy_reason] if call.policy_reason else []
    command = getattr(call.args, "command", None)
    if call.name in policy.SHELL_TOOLS and isinstance(command, str):
        reasons += describe_command(command)
    return reasons


def own_batch_id(uid: int, chosen: str) -> str:
    """A client-chosen batch id in its uid's namespace: ``abc`` → ``1000:abc`` (already
    namespaced ids stay as they are), so one user's id never blocks or reveals another's."""
    prefix = f"{uid}:"
    return chosen if chosen.startswith(prefix) else prefix + chosen
