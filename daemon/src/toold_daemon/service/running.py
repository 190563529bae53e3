"""Running batches: submission, resubmission under a used id, the batch task, cancel.

A submitted batch is planned at once (every call judged by the policy), journaled
(a batch that can change something before it is acknowledged; a read-only one once it
has ended), remembered for ``get_batch``, and run in a task of its own: confirmation
first when the policy asks, then the executor, call after call (a lone read whose worker
answers at once ends without a task). Its events go where ``batch_events`` sends them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Callable

import msgspec

from toold_protocol import (
    Ack,
    BatchAccepted,
    BatchFinished,
    Cancel,
    ProtocolErrorCode,
    SubmitBatch,
    encode,
)

from ..execution.batches import Batch, PreparedCall
from ..records.journal import Journal
from ..records.journal_writer import Commit, JournalWriteFailed
from ..records.stored_batches import Submission, fingerprint
from ..sandbox.lookups import WouldBlock, from_the_caches_alone
from .batch_events import BatchEvents
from .batch_ids import new_batch_id
from .confirming import ConfirmationFlow
from .held_accepts import HeldAccepts, SendAcceptance
from .planning_aside import COSTLY_ARGUMENT_BYTES
from .sessions import NO_PEER, Session
from .shared import Shared, own_batch_id

log = logging.getLogger(__name__)

_TURNS_KEPT = 10_000
#: Writes of one uid waiting for the journal's thread past which that uid's read-only
#: batches wait for their own records...
JOURNAL_BACKLOG = 5_000
#: ... or bytes of results in them (5,000 reads of 800 KB would be 4 GB held in memory).
JOURNAL_BACKLOG_BYTES = 16 << 20
#: Everyone's writes past which every read-only batch waits (what bounds the memory when
#: many uids write at once): a user whose writes do not fill the queue is not held back
#: by another's that do.
JOURNAL_BACKLOG_ALL = 8 * JOURNAL_BACKLOG
JOURNAL_BACKLOG_BYTES_ALL = 8 * JOURNAL_BACKLOG_BYTES


class BatchRuns:
    def __init__(self, shared: Shared, confirming: ConfirmationFlow) -> None:
        self.shared = shared
        self.confirming = confirming
        self.held = HeldAccepts()
        self.events = BatchEvents(shared, self.held)
        self._turns: dict[tuple[int, str], int] = {}
        self._kept_bytes = 0  # of the finished batches kept (``_keep_finished``)
        #: Batch tasks running, of every session (``session.running`` summed, kept at hand).
        self._tasks = 0
        #: Batches of each uid waiting for the journal, whatever became of their sessions.
        self._journal_waits: dict[int, int] = {}

    def submit(
        self,
        session: Session,
        message: SubmitBatch,
        *,
        discovered: bool = False,
        trusted: bool = False,
        prepared: list[PreparedCall] | None = None,
    ) -> None:
        """``trusted``: built by the daemon itself (an undo), so internal tools may appear;
        ``prepared``: its calls, planned aside (``_plan_aside``)."""
        if not discovered and self.shared.discovery_due(session, [call.name for call in message.calls]):
            self.shared.discover_then(session, lambda: self.submit(session, message, discovered=True))
            return
        if not self.shared.accepting:
            self.shared.error(session.peer, message.id, ProtocolErrorCode.SHUTTING_DOWN, "the daemon is shutting down")
            return
        if session.workspace_problem:
            self.shared.error(session.peer, message.id, ProtocolErrorCode.WORKSPACE_REFUSED, session.workspace_problem)
            return
        if (session.journal_waits or session.planning) and prepared is None:
            self._defer(session, lambda: self.submit(session, message, discovered=True, trusted=trusted), message.id)
            return
        chosen = own_batch_id(session.identity.uid, message.batch_id) if message.batch_id is not None else None
        if chosen is not None and self._resubmitted(session, message, chosen):
            return
        if session.running >= self.shared.config.daemon.max_batches_per_session:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"this session already runs {session.running} batches",
            )
            return
        uid = session.identity.uid
        running = sum(s.running - s.journal_waits for s in self.shared.sessions.of_uid(uid))
        if running >= self.shared.config.daemon.max_running_batches_per_uid:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"uid {uid} already runs {running} batches (max_running_batches_per_uid)",
            )
            return
        waiting = self._journal_waits.get(uid, 0)
        if waiting >= self.shared.config.daemon.max_running_batches_per_uid:
            # A session's own waits hold its next submissions back; a client that ends its
            # sessions (by not reading, or by reconnecting) would escape that.
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"uid {uid} has {waiting} batches waiting for the journal to catch up (max_running_batches_per_uid)",
            )
            return
        internal = [c.name for c in message.calls if (t := self.shared.registry.get(c.name)) is not None and t.internal]
        if internal and not trusted:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"{internal[0]} is run by the daemon itself (toolctl undo), not submitted",
            )
            return
        if prepared is None:
            plan = functools.partial(
                self.shared.planner_for(session).plan,
                message.calls,
                turn_iteration=self._count_turn(session, message.turn_id),
            )
            if sum(len(call.arguments) for call in message.calls) > COSTLY_ARGUMENT_BYTES:
                self._plan_aside(session, message, plan, trusted, costly=True)
                return
            try:
                with from_the_caches_alone():
                    prepared = plan()
            except WouldBlock:  # a path the kernel has not cached: looked up on a thread
                self._plan_aside(session, message, plan, trusted, costly=False)
                return
        calls = prepared
        batch_id = chosen or new_batch_id()
        if message.dry_run:
            calls = [call.marked_dry() for call in calls]
        batch = Batch(
            batch_id=batch_id,
            identity=session.identity,
            session_id=session.session_id,
            umask=message.umask if message.umask is not None else session.umask,
            calls=calls,
            results=[None] * len(calls),
            digest=_digest(message) if chosen is not None else "",
            approval_timeout=message.approval_timeout_seconds,
            sandbox=session.sandbox,
            dry_run=message.dry_run,
            argument_bytes=sum(len(call.arguments) for call in message.calls),
        )
        try:
            # A lone read goes to its worker first, so that the worker reads while the loop
            # does the batch's bookkeeping below and gets to its task. It is read-only, so
            # nothing below waits for the journal before it may run (``commit`` is None).
            self.shared.executor.begin(batch)
            planned = batch.plan()
            accepted = BatchAccepted(id=message.id, batch_id=batch_id, calls=planned)
            commit = None
            submission = Submission(
                batch_id,
                session.identity,
                session.client_name,
                message.turn_id,
                batch.digest,
                message.calls,
                planned,
                session.workspace,
            )
            if self.shared.journal is not None and batch.read_only:
                batch.journaled_at_end = True  # one write when it ends (_journal_ended), nobody waits
            elif self.shared.journal is not None:  # journaled before it is acknowledged
                first = batch.runs_at_once()
                started = first.index if first is not None else None
                commit = self.shared.journal.record_batch(submission, started=started, awaited=True)
                if first is not None:
                    first.started_recorded = True
                if commit.settled and commit.error is None:
                    commit = None  # committed already (the journal's thread was idle): acknowledge now
            self.remember(batch)
            if commit is None:
                if _answers_quickly(batch, message):
                    self.held.hold(batch_id, self._acceptance_sender(session, accepted, message.outcome_in_acceptance))
                else:
                    self.shared.reply(session, accepted)
            self.start(
                session,
                batch,
                message.events == "all",
                accepted=accepted,
                commit=commit,
                ended=submission,
                turn=message.turn_id,
            )
            self.held.watch()
        except BaseException:
            # Begun or remembered but never started: nothing would ever end it, and a stopping
            # daemon waits for every batch it knows. Forgotten, abandoned and ended before the
            # error is reported.
            self.forget_batch(batch_id)
            self.held.forget(batch_id)
            self.shared.executor.abandon(batch)
            batch.done.set()
            raise

    def _plan_aside(
        self,
        session: Session,
        message: SubmitBatch,
        plan: Callable[[], list[PreparedCall]],
        trusted: bool,
        *,
        costly: bool,
    ) -> None:
        """Plan on a thread (``planning_aside``), then submit with the plan. The session's
        later submissions wait meanwhile, so its batches are accepted in the order sent."""
        if self.shared.refuses_more_planning(session, message.id):
            return
        session.planning += 1

        async def plan_then_submit() -> None:
            try:
                try:
                    calls = await self.shared.aside.plan(session.identity.uid, plan, costly=costly)
                finally:
                    session.planning -= 1
                if self.shared.sessions.holds(session):  # else its client is gone
                    self.submit(session, message, discovered=True, trusted=trusted, prepared=calls)
            finally:
                if not session.planning and not session.journal_waits:
                    self._resume(session)  # what it held back, whatever became of this one

        self.shared.answer_later(session, message.id, plan_then_submit)

    def _acceptance_sender(self, session: Session, accepted: BatchAccepted, may_carry: bool) -> SendAcceptance:
        """How a held acceptance goes out: with the outcome inside when the batch has
        finished and the client reads it there (one frame instead of two), else alone."""

        def send(outcome: BatchFinished | None) -> bool:
            if outcome is not None and may_carry:
                combined = msgspec.structs.replace(accepted, outcome=outcome)
                self.shared.send(session.peer, encode(combined), flush=True)
                return True
            self.shared.reply(session, accepted)
            return False

        return send

    def _resubmitted(self, session: Session, message: SubmitBatch, batch_id: str) -> bool:
        """A batch id this uid used before: answer from the record and never run anything twice.

        The same calls → the recorded plan, then the recorded results (or the live events of
        a batch still running). Different calls → DUPLICATE_BATCH_ID. (Chosen ids live in
        their uid's namespace, so another user's id never lands here.)
        """
        live = self.shared.batches.get(batch_id)
        stored = self.shared.journal.load(batch_id) if live is None and self.shared.journal is not None else None
        if live is None and stored is None:
            return False
        owner = live.identity.uid if live is not None else stored.identity.uid  # type: ignore[union-attr]
        digest = live.digest if live is not None else stored.fingerprint  # type: ignore[union-attr]
        if owner != session.identity.uid or digest != _digest(message):
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.DUPLICATE_BATCH_ID,
                f"batch id {batch_id!r} was already used for different calls",
                batch_id=batch_id,
            )
            return True
        if live is not None:
            self.shared.reply(session, BatchAccepted(id=message.id, batch_id=batch_id, calls=live.plan()))
            if live.done.is_set():
                self.shared.reply(session, live.outcome())
            else:
                live.listeners.append((session.peer, message.events == "all"))
            return True
        assert stored is not None
        if stored.state == "interrupted":
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.BATCH_INTERRUPTED,
                f"batch {batch_id!r} was interrupted by a daemon restart; resume or discard it "
                f"(toolctl recover {batch_id} --resume|--discard)",
                batch_id=batch_id,
            )
            return True
        self.shared.reply(session, BatchAccepted(id=message.id, batch_id=batch_id, calls=stored.plan()))
        self.shared.reply(session, stored.outcome())
        return True

    def start(
        self,
        session: Session,
        batch: Batch,
        all_events: bool,
        *,
        accepted: BatchAccepted | None = None,
        commit: Commit | None = None,
        ended: Submission | None = None,
        turn: str | None = None,
    ) -> None:
        """Run ``batch`` in a task of its own. With ``commit``, the batch's record must be
        durable first: only then is ``accepted`` sent and anything run. ``ended``: what
        to journal of a batch journaled when it ends."""
        for call in batch.calls:
            if not call.decision:
                call.decision = call.policy_decision()[0]
        if session.peer != NO_PEER:
            batch.listeners.append((session.peer, all_events))
        if commit is None and self._ended_at_once(session, batch, ended, turn):
            return
        run = functools.partial(
            self._run_batch, session, batch, accepted=accepted, commit=commit, ended=ended, turn=turn
        )
        self.shared.tasks.start_soon(run)
        session.running += 1  # (the task, which takes it back when it ends, exists now)
        self._tasks += 1

    async def _run_batch(
        self,
        session: Session,
        batch: Batch,
        *,
        accepted: BatchAccepted | None,
        commit: Commit | None,
        ended: Submission | None,
        turn: str | None,
    ) -> None:
        if commit is not None and not await self._recorded(session, batch, accepted, commit):
            session.running -= 1
            self._tasks -= 1
            return
        emit = self.events.opened(session, batch, turn)
        waited_for_journal = False
        try:
            if not batch.dry_run and any(c.needs_confirmation and c.result is None for c in batch.calls):
                await self.confirming.confirm_batch(session, batch, emit)
            batch.ask_network = functools.partial(self.confirming.ask_network, session=session, batch=batch, emit=emit)
            await self.shared.executor.run(batch, emit)
            if batch.journaled_at_end and ended is not None:
                # Queued before any await (nothing can have forgotten the batch yet); waited
                # for only when the journal falls behind, which holds this session's batch
                # slot until the disk catches up: its next submissions wait (and so slow
                # that client, not the others; they are not refused).
                commit = self._journal_ended(batch, ended)
                if commit.awaited:
                    session.journal_waits += 1
                    waited_for_journal = True
                    self._count_journal_wait(batch.identity.uid, 1)
                    with contextlib.suppress(JournalWriteFailed):  # logged by the writer
                        await commit.durable()
        except Exception:
            # A failed journal write must not take the daemon down with it; the batch's
            # clients still get every result the executor produced.
            log.exception("batch %s failed outside its tools", batch.batch_id)
            if not batch.done.is_set():  # the executor sends its outcome once it has run
                emit(batch.outcome())
        finally:
            # It holds ``emit``, which holds the batch: left set, every batch would be a
            # reference cycle that only the garbage collector frees, tens of thousands of
            # objects at a time (pauses of up to 100 ms under a stream of reads).
            batch.ask_network = None
            self._keep_finished(batch)
            session.running -= 1
            self._tasks -= 1
            if waited_for_journal:
                self._count_journal_wait(batch.identity.uid, -1)
                session.journal_waits -= 1
                if not session.journal_waits and not session.planning:
                    self._resume(session)  # with this batch's slot free

    def _ended_at_once(self, session: Session, batch: Batch, ended: Submission | None, turn: str | None) -> bool:
        """A lone read begun in its worker (``Executor.begin``) whose outcome is there
        once the batch is accepted, or comes within a moment while no client has anything
        for the daemon (``Executor.finished_begun``), ends here, on the loop: no task, so
        no trip through trio's scheduler and no await on the way to the reply. Everything
        else a batch gets is the same: its audit records, events, metrics, journal record
        and kept result. Not when the journal has fallen behind (its record must then be
        waited for)."""
        if len(batch.calls) != 1 or batch.calls[0].context is None:  # not begun (``Executor.begin``)
            return False
        journal = self.shared.journal
        if journal is not None and (ended is None or journal_holds_back(journal, batch.identity.uid)):
            return False
        result = self.shared.executor.finished_begun(batch, self._door_while_idle())
        if result is None:
            return False
        emit = self.events.opened(session, batch, turn)
        try:
            self.shared.executor.end_at_once(batch, result, emit)
            if journal is not None and ended is not None:
                self._journal_ended(batch, ended)
        except Exception:  # as in ``_run_batch``: the client still gets its outcome
            log.exception("batch %s failed outside its tools", batch.batch_id)
            if not batch.done.is_set():
                emit(batch.outcome())
                batch.done.set()
        finally:
            self._keep_finished(batch)
        return True

    def _door_while_idle(self) -> int | None:
        """The clients' door, for a wait on the loop's thread that a frame ends, while the
        loop serves nothing else (``_serves_nothing_else``); else None: no wait is taken."""
        doorbell = self.shared.doorbell
        return doorbell.fileno() if doorbell is not None and self._serves_nothing_else(0) else None

    def serves_one_batch_alone(self) -> bool:
        """Whether a call may hold the loop's thread a moment from inside its batch's task
        (``Workers``' spin for an outcome): the loop serves that batch and nothing else."""
        return self._serves_nothing_else(1)

    def _serves_nothing_else(self, own_tasks: int) -> bool:
        """No frame waits, no other batch's task runs (a command, an MCP call, a write
        waiting for its journal record, a confirmation: what wakes them would wait for a
        wait on the loop's thread), no background job's output comes. One user's stream of
        slow reads would otherwise hold everyone else's work back a moment each."""
        doorbell = self.shared.doorbell
        if self._tasks > own_tasks or (doorbell is not None and doorbell.ringing()):
            return False
        return not self.shared.executor.runner.jobs_running()

    def _defer(self, session: Session, submit: Callable[[], None], request_id: int) -> None:
        """Hold a submission until the session's ended batches are journaled, and its
        batch being planned aside is submitted; past as many as a session may run, it is
        refused."""
        if len(session.deferred) >= self.shared.config.daemon.max_batches_per_session:
            self.shared.error(
                session.peer,
                request_id,
                ProtocolErrorCode.TOO_MANY_BATCHES,
                f"this session already has {len(session.deferred)} batches waiting for earlier ones "
                "(their journal records, or their planning)",
            )
            return
        session.deferred.append(submit)

    def _resume(self, session: Session) -> None:
        """The session's submissions held for the journal, in the order they came. (They
        start their batches' tasks; none of those waits for the journal before this returns.)"""
        waiting, session.deferred = session.deferred, []
        for submit in waiting:
            try:
                submit()
            except Exception:  # never out of the batch's task (it would end the service's nursery)
                log.exception("a submission held for the journal failed")

    def _count_journal_wait(self, uid: int, change: int) -> None:
        waiting = self._journal_waits.get(uid, 0) + change
        if waiting:
            self._journal_waits[uid] = waiting
        else:
            del self._journal_waits[uid]

    def _journal_ended(self, batch: Batch, submission: Submission) -> Commit:
        journal = self.shared.journal
        assert journal is not None
        awaited = journal_holds_back(journal, batch.identity.uid)
        return journal.record_ended(submission, batch.results, batch.state, awaited=awaited)

    async def _recorded(self, session: Session, batch: Batch, accepted: BatchAccepted | None, commit: Commit) -> bool:
        """Wait for the batch's record, then acknowledge it; if the journal cannot take it,
        the batch is refused (nothing ran) and forgotten."""
        try:
            await commit.durable()
        except JournalWriteFailed as exc:
            self.forget_batch(batch.batch_id)
            batch.done.set()
            request_id = accepted.id if accepted is not None else None
            self.shared.error(
                session.peer, request_id, ProtocolErrorCode.INTERNAL, f"the journal could not record the batch: {exc}"
            )
            return False
        if accepted is not None:
            self.shared.reply(session, accepted)
        return True

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

    def cancel(self, session: Session, message: Cancel) -> None:
        batch = self._owned_batch(session, message.id, message.batch_id)
        if batch is None:
            return
        batch.cancel("cancelled by the client")
        self.shared.reply(session, Ack(id=message.id))

    def remember(self, batch: Batch) -> None:
        """Keep finished batches for get_batch; beyond the configured count, drop the oldest
        finished ones. Scans only as far as it needs to (this runs on every submit)."""
        self.shared.batches[batch.batch_id] = batch
        excess = len(self.shared.batches) - self.shared.config.daemon.finished_batches_kept
        if excess > 0:
            oldest_done = (b for b, kept in self.shared.batches.items() if kept.done.is_set())
            for batch_id in list(itertools.islice(oldest_done, excess)):
                self.forget_batch(batch_id)

    def forget_batch(self, batch_id: str) -> None:
        """Drop a batch from those kept (its results go with it; the journal keeps its own)."""
        batch = self.shared.batches.pop(batch_id, None)
        if batch is not None:
            self._kept_bytes -= batch.kept_bytes

    def _keep_finished(self, batch: Batch) -> None:
        """Count a finished batch's arguments and results against ``finished_batches_kept_bytes`` and drop
        the oldest finished batches past it: a client reading large files in a loop would
        otherwise make the daemon hold ``finished_batches_kept`` batches of them."""
        if self.shared.batches.get(batch.batch_id) is not batch:
            return  # forgotten already (refused, discarded)
        batch.kept_bytes = batch.result_bytes() + batch.argument_bytes  # get_batch answers both
        self._kept_bytes += batch.kept_bytes
        over = self._kept_bytes - self.shared.config.daemon.finished_batches_kept_bytes
        if over <= 0:
            return
        doomed = []
        for batch_id, kept in self.shared.batches.items():  # oldest first
            if over <= 0:
                break
            if kept.done.is_set() and kept.kept_bytes:
                doomed.append(batch_id)
                over -= kept.kept_bytes
        for batch_id in doomed:
            self.forget_batch(batch_id)

    def _owned_batch(self, session: Session, request_id: int, batch_id: str) -> Batch | None:
        """The batch, if this session's uid owns it (root may see all). Another uid's batch looks unknown."""
        batch = self.shared.batches.get(self.shared.batch_key(session, batch_id))
        if batch is None or (session.identity.uid not in (batch.identity.uid, 0)):
            self.shared.error(session.peer, request_id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {batch_id!r}")
            return None
        return batch

    def live_state(self, batch_id: str, recorded: str) -> str:
        """The state of a batch this daemon holds, as ``get_batch`` gives it: the journal
        records only a batch's start and end (to keep commits off each call's path), and
        an end it could not record (a full disk) leaves it "running" there."""
        live = self.shared.batches.get(batch_id)
        return live.state if live is not None else recorded


def journal_holds_back(journal: Journal, uid: int) -> bool:
    """Whether ``uid``'s ended read-only batch must wait for its record: its own writes
    fill the journal's queue, or everyone's together do."""
    own_writes, own_bytes = journal.backlog_of(uid)
    return (
        own_writes > JOURNAL_BACKLOG
        or own_bytes > JOURNAL_BACKLOG_BYTES
        or journal.backlog() > JOURNAL_BACKLOG_ALL
        or journal.backlog_bytes() > JOURNAL_BACKLOG_BYTES_ALL
    )


def _digest(message: SubmitBatch) -> str:
    """What makes a resubmission the same batch: its calls, and whether it is a dry run.
    Only a batch whose client chose its id can be submitted again under it (the ids the
    daemon makes are never in a uid's namespace of chosen ones): the others keep none, and
    skip its hash."""
    digest = fingerprint(message.calls)
    return f"dry:{digest}" if message.dry_run else digest


def _answers_quickly(batch: Batch, message: SubmitBatch) -> bool:
    """One call that runs without a person, for a client that wants only the outcome: its
    acceptance is held until it finishes, or for ``HOLD_SECONDS`` (``HeldAccepts``)."""
    if len(batch.calls) != 1 or message.events != "results":
        return False
    call = batch.calls[0]
    return not call.needs_confirmation and not call.awaiting_result
