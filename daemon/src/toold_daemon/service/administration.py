"""Journal and policy administration: batch status and listings, recovery after a
crash, undo, pruning, and the policy (explain, reload).
"""

from __future__ import annotations

import functools
import logging
import os

import msgspec
import trio

from toold_protocol import (
    Ack,
    BatchAccepted,
    BatchList,
    BatchSummary,
    ConnectionList,
    ExplainPolicy,
    GetBatch,
    ListBatches,
    ListConnections,
    PolicyExplanation,
    ProtocolErrorCode,
    Pruned,
    PruneJournal,
    Recover,
    ReloadPolicy,
    SubmitBatch,
    ToolCall,
    UndoBatch,
)

from ..config import ConfigError
from ..config.loading import load_file
from ..egress.rules import NETWORKED_TOOLS, network_summary
from ..execution.batches import Batch, PreparedCall
from ..policy import planner
from ..records.journal import Journal
from ..records.journal_writer import JournalWriteFailed
from ..records.stored_batches import StoredBatch
from ..sandbox import Sandbox
from ..sandbox.lookups import WouldBlock, from_the_caches_alone
from ..sandbox.workspaces import WorkspaceRefused
from ..tools import Tool
from .planning_aside import COSTLY_ARGUMENT_BYTES
from .running import BatchRuns
from .sessions import NO_PEER, Session
from .shared import Shared, own_batch_id

log = logging.getLogger(__name__)

#: How long a start may wait for the disks of the undos the last daemon died in.
FINISHING_UNDOS_SECONDS = 5


class Administration:
    def __init__(self, shared: Shared, runs: BatchRuns) -> None:
        self.shared = shared
        self.runs = runs
        #: Interrupted batches whose resumption is under way (their workspace looked at
        #: on a thread): a second ``recover`` of one is refused, never run twice.
        self._resuming: set[str] = set()

    def _journal(self, session: Session, request_id: int) -> Journal | None:
        """The journal, or None after telling the client this daemon keeps none."""
        if self.shared.journal is None:
            self._journal_disabled(session, request_id)
        return self.shared.journal

    def _journal_disabled(self, session: Session, request_id: int) -> None:
        self.shared.error(session.peer, request_id, ProtocolErrorCode.JOURNAL_DISABLED, "this daemon keeps no journal")

    def _stored(self, session: Session, request_id: int, reference: str) -> StoredBatch | None:
        """The journal's record of the batch ``reference`` names, if this session may see
        it; else None after an UNKNOWN_BATCH (another user's batch looks unknown)."""
        assert self.shared.journal is not None
        stored = self.shared.journal.load(self.shared.batch_key(session, reference))
        if stored is None or not self.shared.may_see(session, stored.identity.uid):
            self.shared.error(session.peer, request_id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {reference!r}")
            return None
        return stored

    def get_batch(self, session: Session, message: GetBatch) -> None:
        """From memory while the daemon knows the batch, else from the journal (after a
        restart, or once it is no longer kept), read once the journal has settled."""
        own = own_batch_id(session.identity.uid, message.batch_id)
        # what batch_key would choose, when it can without asking the journal
        known = own if own in self.shared.batches or own == message.batch_id else None
        batch = self.shared.batches.get(known) if known is not None else None
        if batch is None and self.shared.journal is not None:
            self.shared.answer_later(session, message.id, functools.partial(self._get_stored_batch, session, message))
        elif batch is not None and self.shared.may_see(session, batch.identity.uid):
            self.shared.reply(session, batch.status(message.id))
        else:
            self._unknown(session, message.id, message.batch_id)

    async def _settled_journal(self) -> Journal:
        """The journal, once every write queued before this request is committed."""
        journal = self.shared.journal
        assert journal is not None
        await journal.settled()
        return journal

    async def _get_stored_batch(self, session: Session, message: GetBatch) -> None:
        journal = await self._settled_journal()
        key = self.shared.batch_key(session, message.batch_id, flush=False)
        live = self.shared.batches.get(key)  # it may have been remembered meanwhile
        if live is not None and self.shared.may_see(session, live.identity.uid):
            self.shared.reply(session, live.status(message.id))
            return
        stored = journal.load(key, flush=False)
        if stored is None or not self.shared.may_see(session, stored.identity.uid):
            self._unknown(session, message.id, message.batch_id)
        else:
            self.shared.reply(session, stored.status(message.id))

    def _unknown(self, session: Session, request_id: int, reference: str) -> None:
        self.shared.error(session.peer, request_id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {reference!r}")

    def list_batches(self, session: Session, message: ListBatches) -> None:
        if self._journal(session, message.id) is not None:
            self.shared.answer_later(session, message.id, functools.partial(self._list_batches, session, message))

    async def _list_batches(self, session: Session, message: ListBatches) -> None:
        journal = await self._settled_journal()
        uid = None if session.identity.uid == 0 else session.identity.uid
        rows = journal.summaries(uid=uid, limit=message.limit, flush=False)
        self.shared.reply(
            session,
            BatchList(
                id=message.id,
                batches=[
                    BatchSummary(
                        batch_id=b,
                        state=self.runs.live_state(b, state),  # type: ignore[arg-type]
                        submitted=submitted,
                        calls=calls,
                        uid=owner,
                    )
                    for b, state, submitted, calls, owner in rows
                ],
            ),
        )

    def list_connections(self, session: Session, message: ListConnections) -> None:
        """The MCP servers' connections this session's uid may see (root: everyone's)."""
        if self._journal(session, message.id) is not None:
            self.shared.answer_later(session, message.id, functools.partial(self._list_connections, session, message))

    async def _list_connections(self, session: Session, message: ListConnections) -> None:
        journal = await self._settled_journal()
        uid = None if session.identity.uid == 0 else session.identity.uid
        connections = journal.server_connections(uid=uid, server=message.server, limit=message.limit, flush=False)
        self.shared.reply(session, ConnectionList(id=message.id, connections=connections))

    def recover(self, session: Session, message: Recover) -> None:
        """Resume (run the never-started calls, under today's policy) or discard an interrupted batch."""
        journal = self._journal(session, message.id)
        stored = self._stored(session, message.id, message.batch_id) if journal is not None else None
        if journal is None or stored is None:
            return
        live = self.shared.batches.get(stored.batch_id)
        resuming = stored.batch_id in self._resuming
        if stored.state != "interrupted" or (live is not None and not live.done.is_set()) or resuming:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.NOT_INTERRUPTED,
                f"batch {message.batch_id!r} is "
                + ("being resumed" if resuming else f"{stored.state}, not interrupted"),
            )
            return
        if message.action == "discard":
            journal.discard(stored.batch_id)
            self.runs.forget_batch(stored.batch_id)
            self.shared.reply(session, Ack(id=message.id))
            return
        self._resuming.add(stored.batch_id)
        self.shared.answer_later(session, message.id, functools.partial(self._resume, session, message, stored))

    async def _resume(self, session: Session, message: Recover, stored: StoredBatch) -> None:
        """Plan an interrupted batch's calls as its original owner and client, in its
        workspace, under today's policy, and run them. The workspace is looked at on a
        thread, the plan on the loop only where the kernel has every path cached: its disk
        may not answer (see ``sandbox.lookups``)."""
        journal = self.shared.journal
        assert journal is not None
        uid = stored.identity.uid
        try:
            try:
                choose = functools.partial(self.shared.workspaces.choose, uid, stored.workspace)
                sandbox = await self.shared.aside.plan(uid, choose, costly=False) if stored.workspace else None
            except WorkspaceRefused as exc:
                self.shared.error(
                    session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, f"workspace refused: {exc}"
                )
                return
            owner = planner.Planner(
                self.shared.registry,
                sandbox or self.shared.sandbox,
                self.shared.config,
                stored.identity,
                stored.client_name,
            )
            plan = functools.partial(owner.plan, [_resuming(c.tool_call()) for c in stored.calls])
            calls = await self.shared.aside.plan_soon(uid, plan, costly=False)
        finally:
            self._resuming.discard(stored.batch_id)
        for call in calls:
            recorded = stored.results[call.index]
            if recorded is None and call.result is not None:
                journal.result(stored.batch_id, call.index, call.result)  # refused by today's checks
        self._run_again(session, stored, calls, sandbox, all_events=True)
        # (the batch's task has not run yet: its first event follows this reply)
        self.shared.reply(session, BatchAccepted(id=message.id, batch_id=stored.batch_id, calls=stored.plan()))

    def _run_again(
        self,
        session: Session,
        stored: StoredBatch,
        calls: list[PreparedCall],
        sandbox: Sandbox | None,
        *,
        all_events: bool,
    ) -> None:
        """Run the calls of ``stored`` left to run, planned anew as ``calls``, in a task
        of ``session``'s; the journal says it runs again."""
        journal = self.shared.journal
        assert journal is not None
        batch = Batch(
            batch_id=stored.batch_id,
            identity=stored.identity,
            session_id=session.session_id,
            calls=calls,
            results=list(stored.results),
            digest=stored.fingerprint,
            sandbox=sandbox,
        )
        journal.set_state(stored.batch_id, "running")
        self.runs.remember(batch)
        self.runs.start(session, batch, all_events=all_events)

    async def finish_interrupted_undos(self) -> list[str]:
        """At start: run again every undo the last daemon died in, resuming (what it had
        put back stays, the rest is put back, what it had set aside is removed), as the
        undo's owner in its workspace, with no client to tell. Its result, like any
        other, is journaled: ``journal show`` says it finished after a restart, or why
        it could not. Returns the batch ids started.

        Each workspace is looked at, and each undo planned, on a thread (its disk may not
        answer: an NFS server gone), all within ``FINISHING_UNDOS_SECONDS``, before the
        socket serves. An undo whose disk did not answer in time stays interrupted,
        for ``toolctl recover --resume`` (logged): one user's hung disk must not keep the
        daemon from starting."""
        journal = self.shared.journal
        if journal is None:
            return []
        started: list[str] = []
        waiting = list(journal.undos_to_finish)
        journal.undos_to_finish = []
        with trio.move_on_after(FINISHING_UNDOS_SECONDS):
            while waiting:
                if await self._finish_undo(waiting[0]):
                    started.append(waiting[0])
                waiting.pop(0)
        for batch_id in waiting:
            log.error(
                "cannot finish undo %s: its workspace's disk did not answer within %d s; it stays interrupted "
                "(toolctl recover --resume %s finishes it)",
                batch_id,
                FINISHING_UNDOS_SECONDS,
                batch_id,
            )
        return started

    async def _finish_undo(self, batch_id: str) -> bool:
        journal = self.shared.journal
        assert journal is not None
        stored = journal.load(batch_id)
        if stored is None or stored.state != "interrupted":
            return False
        uid = stored.identity.uid
        try:
            choose = functools.partial(self.shared.workspaces.choose, uid, stored.workspace)
            sandbox = await self.shared.aside.plan(uid, choose, costly=False) if stored.workspace else None
        except WorkspaceRefused as exc:
            log.error("cannot finish undo %s: workspace refused: %s", batch_id, exc)
            return False
        owner = planner.Planner(
            self.shared.registry, sandbox or self.shared.sandbox, self.shared.config, stored.identity, "recovery"
        )
        plan = functools.partial(owner.plan, [_resuming(c.tool_call()) for c in stored.calls])
        calls = await self.shared.aside.plan_soon(uid, plan, costly=False)
        for call in calls:
            call.needs_confirmation = False  # approved before the daemon stopped, and running
        session = Session(session_id=f"recovery-{batch_id}"[:64], peer=NO_PEER, identity=stored.identity)
        self._run_again(session, stored, calls, sandbox, all_events=False)
        log.warning("finishing undo %s, which the daemon stopped in", batch_id)
        return True

    def undo(self, session: Session, message: UndoBatch) -> None:
        """Undo a finished batch: one ``restore_files`` call, submitted as a batch of this
        session (journaled, judged by the policy, itself undoable)."""
        undo = self.shared.executor.undo
        if undo is None:  # the undo store lives beside the journal
            self._journal_disabled(session, message.id)
            return
        stored = self._stored(session, message.id, message.batch_id)  # only its user (or root) finds it
        if stored is None:
            return
        live = self.shared.batches.get(stored.batch_id)
        if stored.state not in ("finished", "cancelled") or (live is not None and not live.done.is_set()):
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.BATCH_NOT_ENDED,
                f"batch {message.batch_id!r} is {stored.state}: only a batch that has ended can be undone",
            )
            return
        arguments = undo.plan(stored, force=message.force, cannot_reverse=self._cannot_reverse)
        base = str(self.shared.sandbox_of(session).working_dir)
        for entry in arguments["entries"]:  # as a model would name them: relative to the workspace
            for key in ("path", "moved_from"):
                if entry.get(key, "").startswith(base.rstrip("/") + "/"):
                    entry[key] = os.path.relpath(entry[key], base)
        call = ToolCall(call_id="undo", name="restore_files", arguments=msgspec.Raw(msgspec.msgpack.encode(arguments)))
        submit = SubmitBatch(
            id=message.id,
            calls=[call],
            events=message.events,
            approval_timeout_seconds=message.approval_timeout_seconds,
        )
        self.runs.submit(session, submit, discovered=True, trusted=True)

    def _cannot_reverse(self, name: str) -> bool:
        """A side-effecting tool that declares no paths it changes: a command, an MCP
        server's tool, daemon state. Its effects are beyond what undo keeps."""
        tool = self.shared.registry.get(name)
        if tool is None:
            return name.startswith("mcp__")
        return tool.side_effecting and type(tool).changes is Tool.changes

    def prune(self, session: Session, message: PruneJournal) -> None:
        """Answered once pruned, a few batches per commit (``Journal.prune``): a
        user pruning a long history must not stall everyone else's calls meanwhile."""
        journal = self._journal(session, message.id)
        if journal is not None:
            self.shared.tasks.start_soon(self._prune, session, message, journal)

    async def _prune(self, session: Session, message: PruneJournal, journal: Journal) -> None:
        everyone = session.identity.uid in (0, self.shared.daemon_uid)
        try:
            removed = await journal.prune(
                older_than_seconds=message.older_than_seconds, uid=None if everyone else session.identity.uid
            )
        except JournalWriteFailed as exc:
            self.shared.error(session.peer, message.id, ProtocolErrorCode.INTERNAL, f"pruning failed: {exc}")
            return
        for batch_id in removed:
            self.runs.forget_batch(batch_id)
        self.shared.reply(session, Pruned(id=message.id, removed=len(removed)))

    def explain(self, session: Session, message: ExplainPolicy) -> None:
        call = ToolCall(call_id="explain", name=message.name, arguments=message.arguments)
        explain = functools.partial(self.shared.planner_for(session).explain, call)
        costly = len(message.arguments) > COSTLY_ARGUMENT_BYTES
        if not costly:
            try:
                with from_the_caches_alone():
                    explained = explain()
            except WouldBlock:  # a path the kernel has not cached: looked up on a thread
                pass
            else:
                self._explained(session, message, explained)
                return
        if self.shared.refuses_more_planning(session, message.id):
            return

        async def explain_aside() -> None:
            explained = await self.shared.aside.plan(session.identity.uid, explain, costly=costly)
            self._explained(session, message, explained)

        self.shared.answer_later(session, message.id, explain_aside)

    def _explained(self, session: Session, message: ExplainPolicy, explained: tuple[str, str, str, int | None]) -> None:
        decision, reason, risk, rule = explained
        tool = self.shared.registry.get(message.name)
        if tool is not None and tool.name in NETWORKED_TOOLS | self._command_tools():
            reason += f"; network: {network_summary(self.shared.config.tools.network, tool.name)}"
        self.shared.reply(
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

    def _command_tools(self) -> set[str]:
        return {entry.name for entry in self.shared.config.tools.commands}

    def reload(self, session: Session, message: ReloadPolicy) -> None:
        if session.identity.uid not in (0, self.shared.daemon_uid):
            self.shared.error(
                session.peer, message.id, ProtocolErrorCode.NOT_AUTHORIZED, "only an administrator may reload"
            )
            return
        problem = self.reload_policy()
        if problem is not None:
            self.shared.error(session.peer, message.id, ProtocolErrorCode.INVALID_MESSAGE, problem)
            return
        self.shared.reply(session, Ack(id=message.id))

    def reload_policy(self) -> str | None:
        """Swap in ``[tools.approval]`` from the config file, atomically; None on success,
        else why the new policy was refused (the old one stays). Batches already planned
        keep the decisions they were planned with."""
        if self.shared.config_path is None:
            return "the daemon was started without --config; there is no policy file to reload"
        try:
            fresh = load_file(self.shared.config_path)
        except ConfigError as exc:
            log.error("policy reload refused, keeping the old policy: %s", exc)
            return f"policy reload refused, keeping the old policy: {exc}"
        tools = msgspec.structs.replace(self.shared.config.tools, approval=fresh.tools.approval)
        self.shared.config = msgspec.structs.replace(self.shared.config, tools=tools)
        log.info("policy reloaded from %s (%d rules)", self.shared.config_path, len(fresh.tools.approval.rules))
        return None


def _resuming(call: ToolCall) -> ToolCall:
    """An undo's ``restore_files`` call, marked to resume: what it had put back before it
    was interrupted is where the undo left it, not a change made since (any other call
    as it is)."""
    if call.name != "restore_files":
        return call
    arguments = msgspec.msgpack.decode(call.arguments)
    if isinstance(arguments, dict):
        arguments["resume"] = True
    return ToolCall(call_id=call.call_id, name=call.name, arguments=msgspec.Raw(msgspec.msgpack.encode(arguments)))
