"""Running a planned batch: sequentially, in call order, one result per call, always.

Each call runs inside its own trio cancel scope with the call's deadline; a
batch cancel cancels the current scope and resolves the remaining calls as
Cancelled. A ToolError becomes its error result; any other exception from a tool
becomes ``Tool failed: ...``. What stops a batch early says why in each call it leaves
unrun: a journal write that failed (``NOT_JOURNALED``: a side-effecting batch runs a
call only once the one before is recorded), or the daemon's own failure while running
a call (``INTERNAL_ERROR`` for that call, ``NOT_RUN`` after it). Events go to ``emit``,
which never blocks.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec
import trio

from toold_protocol import (
    BatchState,
    CallFinished,
    CallStarted,
    OutputChunk,
    ToolErrorType,
    ToolResult,
)

from ..config import Config
from ..errors import ToolError
from ..output import NOTHING_UNSEEN, Unseen
from ..records.journal_writer import Commit, JournalWriteFailed
from ..sandbox import Sandbox
from ..tools._base import Tool, ToolContext, ToolOutput, _Cancelled
from ..undo.ledger import UndoLedger
from ..undo.restore import RestoreArgs
from . import results
from .batches import Batch, PreparedCall
from .reads import ReadTracker
from .runner import ToolRunner

Emit = Callable[[msgspec.Struct], None]
log = logging.getLogger(__name__)


class Recorder(Protocol):
    """Where the executor journals a batch's progress. Each method queues the write and
    returns its ``Commit``; the executor awaits ``durable()`` where it must act only on a
    durable fact (a side-effecting batch: the started mark before the tool runs, each
    result before it is sent or the next call starts)."""

    def started(self, batch_id: str, index: int) -> Commit: ...

    def result(
        self,
        batch_id: str,
        index: int,
        result: ToolResult,
        *,
        final_state: BatchState | None = None,
        changes: Sequence[Any] = (),
        undo_bytes: int = 0,
        awaited: bool = False,
    ) -> Commit: ...

    def batch_done(self, batch_id: str, state: BatchState) -> Commit: ...


class NoRecorder:
    """For a daemon without a journal."""

    def started(self, batch_id: str, index: int) -> Commit:
        return Commit.done()

    def result(
        self,
        batch_id: str,
        index: int,
        result: ToolResult,
        *,
        final_state: BatchState | None = None,
        changes: Sequence[Any] = (),
        undo_bytes: int = 0,
        awaited: bool = False,
    ) -> Commit:
        return Commit.done()

    def batch_done(self, batch_id: str, state: BatchState) -> Commit:
        return Commit.done()


NO_RECORDER = NoRecorder()


#: Pre-images up to this many bytes in all are stored on the loop (about 0.5 ms of it).
KEEP_ON_THE_LOOP_BYTES = 256 << 10


class Executor:
    def __init__(
        self,
        runner: ToolRunner,
        sandbox: Sandbox,
        config: Config,
        recorder: Recorder | None = None,
        undo: UndoLedger | None = None,
    ) -> None:
        self.runner = runner
        self.undo = undo
        self.sandbox = sandbox
        self.config = config
        self.recorder: Recorder = recorder or NO_RECORDER
        self.reads = ReadTracker()

    async def run(self, batch: Batch, emit: Emit) -> None:
        batch.state = "running"
        # A batch journaled when it ends records nothing per call; a read-only batch's
        # writes are not waited for; the others wait for each result's commit.
        recorder = NO_RECORDER if batch.journaled_at_end else self.recorder
        durable = not batch.read_only
        state_recorded = False
        stopped: ToolError | None = None  # why the batch stopped early: said in each call it left unrun
        try:
            for call in batch.calls:
                if batch.results[call.index] is not None:
                    continue
                try:
                    result = await self._resolve(batch, call, emit)
                except JournalWriteFailed as exc:  # its started mark: it must not run unrecorded
                    stopped = _not_run(
                        "NOT_JOURNALED", f"the journal could not record that call {call.index} started: {exc}"
                    )
                    break
                except Exception as exc:  # a defect of the daemon's (a tool's own failure is a result)
                    log.exception("batch %s: call %d failed inside the daemon", batch.batch_id, call.index)
                    result = results.failure(call.call_id, _internal_error(exc))
                    stopped = _not_run("NOT_RUN", f"the daemon failed while running call {call.index}")
                # The last result and the batch's final state share one journal transaction.
                final: BatchState | None = None
                if call.index == len(batch.calls) - 1:
                    final = _ended_state(batch, result)
                commit = None
                if call.result is None:  # pre-resolved results were journaled with the batch
                    commit = recorder.result(
                        batch.batch_id,
                        call.index,
                        result,
                        final_state=final,
                        changes=call.changes,
                        undo_bytes=call.undo_bytes,
                        awaited=durable,
                    )
                elif final is not None:
                    recorder.batch_done(batch.batch_id, final)
                state_recorded = final is not None
                batch.results[call.index] = result
                if commit is not None and durable and (unrecorded := await _unrecorded(commit, call.index)):
                    stopped, state_recorded = unrecorded, False
                # A result the journal could not keep still happened: its client learns it.
                emit(CallFinished(batch_id=batch.batch_id, index=call.index, result=result))
                if stopped is not None:
                    break
        finally:
            self.abandon(batch)
            # Whatever stopped the loop (even the daemon's own cancellation), every call gets a result.
            for call in batch.calls:
                if batch.results[call.index] is None:
                    if stopped is not None and batch.cancel_reason is None:
                        # (a result known without running, journaled with the batch, stands)
                        result = call.result or results.failure(call.call_id, stopped)
                    else:
                        result = _cancelled(call.call_id, batch.cancel_reason or "daemon stopped")
                    recorder.result(batch.batch_id, call.index, result)
                    batch.results[call.index] = result
            batch.state = _ended_state(batch)
            if not state_recorded:
                recorder.batch_done(batch.batch_id, batch.state)
            emit(batch.outcome())
            batch.done.set()

    async def _resolve(self, batch: Batch, call: PreparedCall, emit: Emit) -> ToolResult:
        if call.result is not None:
            return call.result
        if batch.cancel_reason is not None:
            return _cancelled(call.call_id, batch.cancel_reason)
        if batch.dry_run:
            return await self._dry_run(batch, call)
        if call.denial is not None:
            return call.denial
        if call.awaiting_result:
            return await self._wait_supplied(batch, call)
        if call.needs_confirmation:  # never run what nobody approved, whatever path led here
            return results.failure(
                call.call_id, ToolError(ToolErrorType.DENIED, "NOT_CONFIRMED", "Denied: the call was not confirmed")
            )
        assert call.tool is not None
        if call.tool.side_effecting and not call.started_recorded:
            # Only a call that may have side effects needs the mark that forbids running it again
            # after a crash; a read-only call without a result is simply run again on resume.
            await self.recorder.started(batch.batch_id, call.index).durable()
        emit(CallStarted(batch_id=batch.batch_id, call_id=call.call_id, index=call.index, name=call.name))
        return await self._run_call(batch, call, call.tool, emit)

    def begin(self, batch: Batch) -> None:
        """A batch of one read-only call that runs as soon as its task does: the runner may
        send the call on its way now (``ToolRunner.begin``), so that the worker reads while
        the event loop gets to the task (~150 µs here). ``run`` finishes it; a call that is
        not reached (the batch was cancelled first) is abandoned there."""
        if len(batch.calls) != 1 or batch.dry_run:
            return
        call = batch.calls[0]
        tool = call.tool
        if (
            tool is None
            or tool.side_effecting
            or call.result is not None
            or call.denial is not None
            or call.needs_confirmation
            or call.awaiting_result
        ):
            return
        call.context = self._context(batch, call)
        call.begun_at = time.monotonic()
        try:
            self.runner.begin(tool, call.args, call.context, batch.identity)
        except Exception:  # starting early is an optimisation: the call then starts in ``run``
            log.exception("call %s could not be begun early", call.call_id)

    def finished_begun(self, batch: Batch, interrupt_fd: int | None) -> ToolResult | None:
        """The result of a batch's one call begun early (``begin``) if its worker has
        answered, or answers within a short wait that ``interrupt_fd`` ends
        (``ToolRunner.finished``): the batch can then end at once, on the loop
        (``end_at_once``), without a task, a cancel scope or the layers of ``run``; no
        cancel or timeout can come meanwhile. None: ``run`` runs it.

        Only for a batch that records nothing per call (journaled when it ends, or no
        journal): ``run`` would have recorded nothing either."""
        if len(batch.calls) != 1:
            return None
        call = batch.calls[0]
        ctx = call.context
        if ctx is None or ctx.begun is None or not (batch.journaled_at_end or self.recorder is NO_RECORDER):
            return None
        try:
            output = self.runner.finished(ctx, interrupt_fd)
        except ToolError as exc:  # (a read-only call changes nothing: no undo to keep)
            call.context = None
            return self._failed(call, exc.with_traceback(None), call.begun_at)
        if output is None:
            return None
        call.context = None
        self.reads.update(batch.session_id, output.records)
        return self._succeeded(call, output, output.content, output.data, call.begun_at)

    def end_at_once(self, batch: Batch, result: ToolResult, emit: Emit) -> None:
        """End a batch of one call with its result from ``finished_begun``, with the
        events and states ``run`` would have given it."""
        call = batch.calls[0]
        batch.results[call.index] = result  # (first: whatever fails below, the outcome holds it)
        batch.state = "running"
        try:
            emit(CallStarted(batch_id=batch.batch_id, call_id=call.call_id, index=call.index, name=call.name))
            emit(CallFinished(batch_id=batch.batch_id, index=call.index, result=result))
        finally:
            batch.state = _ended_state(batch)
            emit(batch.outcome())
            batch.done.set()

    def abandon(self, batch: Batch) -> None:
        """Calls of ``batch`` that were begun and will not be run (``ToolRunner.abandon``)."""
        for call in batch.calls:
            if call.context is not None:
                context, call.context = call.context, None
                self.runner.abandon(context)

    def _context(self, batch: Batch, call: PreparedCall) -> ToolContext:
        return ToolContext(
            call_id=call.call_id,
            sandbox=batch.sandbox or self.sandbox,
            config=self.config,
            resolved=call.resolved,
            reads=self.reads.for_paths(batch.session_id, [str(p) for p in call.resolved.values()]),
            identity=batch.identity,
            umask=batch.umask,
        )

    async def _run_call(self, batch: Batch, call: PreparedCall, tool: Tool[Any], emit: Emit) -> ToolResult:
        ctx, call.context = call.context or self._context(batch, call), None
        ctx.emit = _chunk_emitter(batch.batch_id, call.call_id, emit)
        if batch.ask_network is not None:
            ctx.ask_network = functools.partial(batch.ask_network, call)
        if self.undo is not None and tool.side_effecting:
            ctx.undo_budget = max(0, self.undo.max_bytes_per_batch - batch.undo_bytes)
            if isinstance(call.args, RestoreArgs):
                ctx.blobs = await self.undo.blobs_for(batch.identity.uid, call.args)
        timeout = tool.timeout_seconds(call.args) or self.timeout_for(tool)
        started = time.monotonic()
        output = None
        failure: ToolResult | None = None
        failed: ToolError | None = None
        with trio.move_on_after(timeout) as scope:
            batch.current_scope = scope
            try:
                output = await self.runner.run(tool, call.args, ctx, batch.identity)
            except ToolError as exc:
                # (kept past this block without its traceback: through the traceback's frame,
                # this one, it would hold itself, and the batch would wait for the collector)
                failed = exc.with_traceback(None)
            except _Cancelled:
                pass
            except Exception as exc:
                failure = results.crashed(call.call_id, exc, duration_ms=_ms(started))
            finally:
                batch.current_scope = None
        if failed is not None:
            return self._failed(
                call, await self._failed_after_changes(batch, call, failed) if failed.changes else failed, started
            )
        if failure is not None:
            return failure
        limits = self.config.tools.output
        if output is None or scope.cancelled_caught:
            ctx.cancelled.set()
            partial = "".join(ctx.partial)
            dropped_bytes, dropped_lines = ctx.partial_dropped
            # What streamed past the kept part is counted; what the command would still
            # have printed is not known: "at least".
            unseen = Unseen(dropped_bytes, dropped_lines, exact=False) if dropped_bytes else NOTHING_UNSEEN
            if batch.cancel_reason is not None:
                error = _cancel_error(batch.cancel_reason)
            else:
                elapsed = time.monotonic() - started
                error = ToolError(
                    ToolErrorType.TIMEOUT,
                    "TIMEOUT",
                    f"{tool.name} timed out after {elapsed:.1f}s (limit {timeout:g}s)",
                    tool=tool.name,
                    elapsed_ms=round(elapsed * 1000),
                    timeout_ms=round(timeout * 1000),
                )
            ended = results.failure(
                call.call_id,
                error,
                duration_ms=_ms(started),
                output=partial,
                unseen=unseen,
                max_bytes=limits.max_bytes,
                max_lines=limits.max_lines,
            )
            # the connections a command made before it was stopped: in its result, journaled
            return msgspec.structs.replace(ended, data=ctx.network) if ctx.network else ended
        self.reads.update(batch.session_id, output.records)
        content, data = output.content, output.data
        if output.changes and self.undo is not None:
            not_undoable = await self._keep_for_undo(batch, call, output.changes)
            if not_undoable:  # said in the result, never silently
                content += f"\n[toold: not undoable: {'; '.join(not_undoable[:20])}]"
                data = {**(data or {}), "not_undoable": not_undoable}
        return self._succeeded(call, output, content, data, started)

    def _succeeded(
        self, call: PreparedCall, output: ToolOutput, content: str, data: dict[str, Any] | None, started: float
    ) -> ToolResult:
        limits = self.config.tools.output
        return results.success(
            call.call_id,
            content,
            output.display,
            data,
            allow_truncation=output.allow_truncation,
            max_bytes=limits.max_bytes,
            max_lines=limits.max_lines,
            duration_ms=_ms(started),
            tail=output.tail,
            unseen=output.unseen,
        )

    def _failed(self, call: PreparedCall, error: ToolError, started: float) -> ToolResult:
        limits = self.config.tools.output
        return results.failure(
            call.call_id, error, duration_ms=_ms(started), max_bytes=limits.max_bytes, max_lines=limits.max_lines
        )

    async def _keep_for_undo(self, batch: Batch, call: PreparedCall, changes: list[Any]) -> list[str]:
        """Keep what the call changed for its batch's undo; the paths that cannot be put
        back ("path (why)"). Large ones on a thread: hashing and writing up to the undo
        bound (64 MiB) held the loop, and every other client, for a quarter of a second;
        a small one costs less than the trip to a thread (a write's protocol CPU +11 %)."""
        assert self.undo is not None
        if sum(len(change.before.data) for change in changes) <= KEEP_ON_THE_LOOP_BYTES:
            kept = self.undo.keep(changes)
        else:
            kept = await trio.to_thread.run_sync(self.undo.keep, changes)
        batch.undo_bytes += kept.stored_bytes
        call.undo_bytes = kept.stored_bytes
        call.changes = kept.changes
        return kept.not_undoable

    async def _failed_after_changes(self, batch: Batch, call: PreparedCall, error: ToolError) -> ToolError:
        """A tool that failed after changing some paths (``undo.capture``): what it changed
        is kept for undo like a success's, and its error says what that was."""
        sandbox = batch.sandbox or self.sandbox
        changed = [sandbox.display(change.before.path) for change in error.changes]  # (only what changed)
        if self.undo is None:
            how = "this daemon keeps no undo data"
        else:
            not_undoable = await self._keep_for_undo(batch, call, error.changes)
            how = "toolctl undo puts them back" + (
                f"; not undoable: {'; '.join(not_undoable[:20])}" if not_undoable else ""
            )
        listed = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
        message = f"{error.message} (before it failed it changed {len(changed)} path(s): {listed}; {how})"
        return ToolError(error.type, error.code, message, **error.details, changed=changed[:1000])

    async def _dry_run(self, batch: Batch, call: PreparedCall) -> ToolResult:
        """What the call would do, computed without doing it: the policy's decision, and
        for a tool that can preview its effect (writes, edits, patches, deletes, moves)
        that preview, made in the user's worker. Nothing else runs: no command, no read."""
        assert call.tool is not None
        tool = call.tool
        decision = "deny" if call.denial is not None else "ask" if call.needs_confirmation else "allow"
        data: dict[str, Any] = {"dry_run": True, "policy": decision, "reason": call.policy_reason}
        if call.locations:
            data["paths"] = call.locations
        lines = [f"[dry run: the policy would {decision} this call ({call.policy_reason or 'no reason given'})]"]
        if type(tool).preview is not Tool.preview and tool.side_effecting:
            ctx = ToolContext(call_id=call.call_id, sandbox=batch.sandbox or self.sandbox, config=self.config)
            ctx.resolved = call.resolved
            try:
                diff = await self.runner.preview(tool, call.args, ctx, batch.identity)
            except ToolError as exc:
                return results.failure(call.call_id, exc)
            data["diff"] = diff or ""
            lines.append(diff or f"{call.summary}: no change to show")
        elif tool.side_effecting:
            lines.append(f"not run in a dry run: {call.summary}")
        else:
            lines.append(f"read-only, not run in a dry run: {call.summary}")
        limits = self.config.tools.output
        return results.success(
            call.call_id,
            "\n".join(lines),
            None,
            data,
            max_bytes=limits.max_bytes,
            max_lines=limits.max_lines,
            duration_ms=0.0,
            allow_truncation=True,
        )

    async def _wait_supplied(self, batch: Batch, call: PreparedCall) -> ToolResult:
        """Parse-only mode: the result a person supplies, or a timeout/cancel error."""
        timeout = self.config.tools.approval.timeout_seconds
        with trio.move_on_after(timeout) as scope:
            batch.current_scope = scope
            try:
                await call.supplied_event.wait()
            finally:
                batch.current_scope = None
        if call.supplied is not None:
            return call.supplied
        if batch.cancel_reason is not None:
            return _cancelled(call.call_id, batch.cancel_reason)
        return results.failure(
            call.call_id,
            ToolError(ToolErrorType.TIMEOUT, "NO_RESULT_SUPPLIED", f"no result was supplied within {timeout:g}s"),
        )

    def timeout_for(self, tool: Tool[Any]) -> float:
        timeouts = self.config.tools.timeouts
        if tool.timeout_kind == "undo":
            return max(UNDO_SECONDS, timeouts.file_operations_seconds)
        if tool.timeout_kind == "file":
            return timeouts.file_operations_seconds
        if tool.timeout_kind == "shell":
            return timeouts.shell_commands_seconds
        return timeouts.default_seconds


#: How long an undo may run. It is bounded by its plan (10,000 paths, the undo bound of
#: bytes; 9,000 files took 8 s here), and one stopped midway leaves its tree half put
#: back: the 30 s of a file operation would do that to a large undo on a slow disk.
UNDO_SECONDS = 600.0


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000


def _ended_state(batch: Batch, last: ToolResult | None = None) -> BatchState:
    """``cancelled`` when a cancel stopped one of its calls; a cancel that came once every
    call had its result (the last one ``last``, not yet stored) changed nothing: ``finished``."""
    if batch.cancel_reason is None:
        return "finished"
    ended = [*batch.results, last]
    stopped = any(r is not None and r.error is not None and r.error.type == ToolErrorType.CANCELLED for r in ended)
    return "cancelled" if stopped else "finished"


async def _unrecorded(commit: Commit, index: int) -> ToolError | None:
    """None once call ``index``'s result ``commit`` is durable; else what the calls it
    stops say: a side-effecting batch runs a call only once what came before is recorded
    (a restart must never run anything twice)."""
    try:
        await commit.durable()
    except JournalWriteFailed as exc:
        return _not_run("NOT_JOURNALED", f"the journal could not record call {index}'s result: {exc}")
    return None


def _not_run(code: str, why: str) -> ToolError:
    """What a call the batch stopped before says."""
    return ToolError(ToolErrorType.EXECUTION_FAILED, code, f"Not run: {why}")


def _internal_error(exc: Exception) -> ToolError:
    """A call the daemon failed while running (a defect of ours, logged with its traceback)."""
    return ToolError(
        ToolErrorType.EXECUTION_FAILED,
        "INTERNAL_ERROR",
        f"the daemon failed while running this call ({type(exc).__name__}: {exc}); it may have had effects",
    )


def _cancelled(call_id: str, reason: str) -> ToolResult:
    return results.failure(call_id, _cancel_error(reason))


def _cancel_error(reason: str) -> ToolError:
    return ToolError(ToolErrorType.CANCELLED, "CANCELLED", f"Cancelled: {reason}")


def _chunk_emitter(batch_id: str, call_id: str, emit: Emit) -> Callable[..., None]:
    """``ctx.emit`` for one call: numbered ``output_chunk`` events."""
    seq = 0

    def chunk(stream: str, data: str, coalesced: int = 1) -> None:
        nonlocal seq
        event = OutputChunk(batch_id=batch_id, call_id=call_id, stream=stream, data=data, seq=seq, coalesced=coalesced)  # type: ignore[arg-type]
        emit(event)
        seq += 1

    return chunk
