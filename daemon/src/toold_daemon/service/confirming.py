"""The confirmation flow: asking before a batch runs, and the answers.

When the policy asks about calls of a batch, one ``confirmation_requested`` lists them
all (with diffs made in the client's worker) before anything in the batch runs. It goes
to the submitting session and to every subscribed approver allowed to answer
(``Confirmations`` decides who). The first authorized answer applies; no answer before
the timeout, or a cancel, denies. Parse-only mode's supplied results arrive here too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
import trio

from toold_protocol import (
    Ack,
    Confirm,
    ConfirmationItem,
    ConfirmationRequested,
    ProtocolErrorCode,
    Subscribe,
    SupplyResult,
    ToolErrorType,
    ToolResult,
    encode,
)

from .. import policy
from ..errors import ToolError
from ..execution import results
from ..execution.batches import Batch, PreparedCall
from ..policy import planner
from ..policy.confirmations import Pending
from ..policy.engine import describe_command
from ..redaction import hide_secrets, hide_secrets_in
from ..tools import ToolContext
from .planning_aside import COSTLY_ARGUMENT_BYTES
from .sessions import Session
from .shared import Shared


class ConfirmationFlow:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def confirm_batch(self, session: Session, batch: Batch, emit: Callable[[msgspec.Struct], None]) -> None:
        """Ask once for every call that needs it, wait for an authorized answer (or the
        timeout, or a cancel), and apply it before anything in the batch runs."""
        approval = self.shared.config.tools.approval
        asked = [c for c in batch.calls if c.needs_confirmation and c.result is None]
        items = [
            ConfirmationItem(
                call_id=c.call_id,
                name=c.name,
                summary=c.summary,
                risk=c.risk,  # type: ignore[arg-type]
                locations=c.locations,
                diff=await self._preview(batch, c),
                arguments=hide_secrets_in(msgspec.to_builtins(c.args)),
                reasons=[hide_secrets(reason) for reason in _reasons_for_people(c)],
            )
            for c in asked
        ]
        pending = self._open(session, batch, items, batch.approval_timeout or approval.timeout_seconds, emit)
        batch.state = "awaiting_confirmation"
        try:
            with trio.move_on_at(trio.current_time() + (batch.approval_timeout or approval.timeout_seconds)) as scope:
                batch.current_scope = scope
                if batch.cancel_reason is None:
                    await pending.decided.wait()
        finally:
            batch.current_scope = None
            self.shared.confirmations.close(pending)
        await self._apply_answer(session, batch, asked, pending)
        batch.state = "running"

    def _open(
        self,
        session: Session,
        batch: Batch,
        items: list[ConfirmationItem],
        timeout: float,
        emit: Callable[[msgspec.Struct], None],
    ) -> Pending:
        """Open a confirmation and send it to the batch's listeners and every approver."""
        pending = self.shared.confirmations.open(
            batch_id=batch.batch_id, owner=batch.identity, submitter=session.peer, items=items, timeout=timeout
        )
        request = ConfirmationRequested(
            batch_id=batch.batch_id,
            correlation_id=pending.correlation_id,
            calls=items,
            expires_in_ms=pending.remaining_ms(),
        )
        emit(request)
        frame = encode(request)
        approver_gids = self.shared.config.tools.approval.approver_gids
        for peer in self.shared.confirmations.approver_peers(pending, approver_gids):
            self.shared.send(peer, frame)
        return pending

    async def ask_network(
        self,
        call: PreparedCall,
        host: str,
        port: int,
        *,
        session: Session,
        batch: Batch,
        emit: Callable[[msgspec.Struct], None],
    ) -> tuple[bool, str]:
        """A running command wants a host that no rule allows or denies: ask the person (the
        connection waits, as a confirmation does), once or for the rest of the session."""
        key = f"network:{host}:{port}"
        if key in session.grants:
            return True, f"{host}:{port} allowed for this session by an earlier answer"
        stored = getattr(self.shared.executor.runner, "user_state", None)
        scope = f"workspace:{(batch.sandbox or self.shared.sandbox).roots[0]}"
        if stored is not None and await trio.to_thread.run_sync(stored.granted, batch.identity.uid, scope, key):
            return True, f"{host}:{port} allowed in this workspace by an earlier answer"
        network = self.shared.config.tools.network
        item = ConfirmationItem(
            call_id=call.call_id,
            name="network",
            summary=planner.redact(f"{call.name} connects to {host}:{port}: {call.summary}"),
            risk="high",
            arguments={"host": host, "port": port, "call": hide_secrets(call.summary)},
            reasons=[
                f"{host} is neither in [tools.network] allowed_domains nor in denied_domains",
                hide_secrets(f"asked by the running call {call.call_id} ({call.name}): {call.summary}"),
            ],
        )
        pending = self._open(session, batch, [item], network.ask_timeout_seconds, emit)
        try:
            with trio.move_on_after(network.ask_timeout_seconds):
                await pending.decided.wait()
        finally:
            self.shared.confirmations.close(pending)
        answer, by = pending.answer, pending.answered_by
        audit = self.shared.audit
        if answer is None:
            audit.answered(batch, call, "unanswered", None, host=f"{host}:{port}")
            return False, f"nobody answered about {host}:{port} within {network.ask_timeout_seconds:g} s"
        approved = answer.decision == "approve_all" or (
            answer.decision == "approve_selected" and call.call_id in answer.approved_call_ids
        )
        who = f"uid {by.uid}" if by is not None else "the approver"
        remembered = "workspace" if answer.remember_for_workspace else "session" if answer.remember_for_session else ""
        audit.answered(
            batch,
            call,
            "approved" if approved else "denied",
            by,
            remembered=remembered if approved else "",
            host=f"{host}:{port}",
        )
        if not approved:
            return False, f"{host}:{port} denied by {who}"
        if answer.remember_for_session:
            session.grants.add(key)
        if answer.remember_for_workspace and stored is not None:
            if await trio.to_thread.run_sync(stored.grant, batch.identity.uid, scope, key):
                return True, f"{host}:{port} approved by {who} for this workspace"
            return True, f"{host}:{port} approved by {who} (not kept for the workspace: this user keeps too many hosts)"
        return True, f"{host}:{port} approved by {who}" + (" for this session" if answer.remember_for_session else "")

    async def _preview(self, batch: Batch, call: PreparedCall) -> str | None:
        """The diff a person should see before approving an edit (None when there is none,
        or when it cannot be made quickly: a preview never blocks the request)."""
        if call.tool is None:
            return None
        sandbox = batch.sandbox or self.shared.sandbox
        ctx = ToolContext(call_id=call.call_id, sandbox=sandbox, config=self.shared.config, resolved=call.resolved)
        with trio.move_on_after(5):
            try:
                diff = await self.shared.executor.runner.preview(call.tool, call.args, ctx, batch.identity)
            except Exception as exc:  # a failing edit shows why in the request instead of a diff
                return f"[no preview: {type(exc).__name__}: {str(exc)[:300]}]"
            return diff[:50_000] if diff else None
        return None

    async def _apply_answer(self, session: Session, batch: Batch, asked: list[PreparedCall], pending: Pending) -> None:
        answer, by = pending.answer, pending.answered_by
        for call in asked:
            if batch.cancel_reason is not None:
                return  # the executor gives every remaining call its Cancelled result
            if answer is None:
                waited = batch.approval_timeout or self.shared.config.tools.approval.timeout_seconds
                call.denial = _unanswered(call, waited)
                self.shared.audit.answered(batch, call, "unanswered", None)
                continue
            approved = answer.decision == "approve_all" or (
                answer.decision == "approve_selected" and call.call_id in answer.approved_call_ids
            )
            self.shared.audit.answered(
                batch,
                call,
                "approved" if approved else "denied",
                by,
                remembered="session" if approved and answer.remember_for_session else "",
            )
            if not approved:
                who = f"uid {by.uid}" if by is not None else "the approver"
                call.denial = _denied(call, f"denied by {who}" + (f": {answer.reason}" if answer.reason else ""))
                continue
            call.needs_confirmation = False
            modified = answer.modified_arguments.get(call.call_id)
            if modified is not None:
                replan = functools.partial(self.shared.planner_for(session).replan, call, modified)
                await self.shared.aside.plan_soon(
                    batch.identity.uid, replan, costly=len(modified) > COSTLY_ARGUMENT_BYTES
                )
            if answer.remember_for_session and call.denial is None:
                key = planner.grant_key(call)
                if key:
                    session.grants.add(key)

    def answer(self, session: Session, message: Confirm) -> None:
        approval = self.shared.config.tools.approval
        pending = self.shared.confirmations.pending.get(message.correlation_id)
        if pending is None or not self.shared.confirmations.may_answer(
            session.peer, session.identity, pending, approval.approver_gids
        ):
            # The same answer whether the id does not exist or belongs to someone else:
            # another user learns nothing about other users' requests.
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.NOT_AUTHORIZED,
                f"no pending confirmation {message.correlation_id[:64]!r} that this session may answer",
            )
            return
        if pending.decided.is_set():
            self.shared.error(session.peer, message.id, ProtocolErrorCode.NOT_AUTHORIZED, "already answered")
            return
        known = {item.call_id for item in pending.items}
        unknown = [c for c in [*message.approved_call_ids, *message.modified_arguments] if c not in known]
        if unknown:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"call ids not in this confirmation: {', '.join(map(repr, unknown[:10]))}",
            )
            return
        pending.answer, pending.answered_by = message, session.identity
        pending.decided.set()
        self.shared.reply(session, Ack(id=message.id))

    def subscribe(self, session: Session, message: Subscribe) -> None:
        """Become an approver: the pending requests this session may answer come first,
        then the ``ack``; new ones follow as they are made."""
        self.shared.confirmations.subscribe(session.peer, session.identity)
        approval = self.shared.config.tools.approval
        # batches already waiting for a person's result (parse-only), so a watcher that
        # starts late still sees them and how to answer
        for batch in list(self.shared.batches.values()):
            waiting = not batch.done.is_set() and any(c.awaiting_result and c.supplied is None for c in batch.calls)
            if waiting and self.shared.confirmations.may_watch(session.peer, batch.identity, approval.approver_gids):
                self.shared.reply(session, batch.status(0))
        for pending in self.shared.confirmations.visible_to(session.peer, session.identity, approval.approver_gids):
            self.shared.reply(
                session,
                ConfirmationRequested(
                    batch_id=pending.batch_id,
                    correlation_id=pending.correlation_id,
                    calls=pending.items,
                    expires_in_ms=pending.remaining_ms(),
                ),
            )
        self.shared.reply(session, Ack(id=message.id))

    def supply(self, session: Session, message: SupplyResult) -> None:
        """Parse-only mode: a person's result for a pending call, from the batch's own uid
        (or an approver group). The result is bounded and sanitized like a tool's."""
        batch = self.shared.batches.get(self.shared.batch_key(session, message.batch_id))
        approver_gids = self.shared.config.tools.approval.approver_gids
        allowed = batch is not None and (
            session.identity.uid == batch.identity.uid
            or self.shared.confirmations.may_watch(session.peer, batch.identity, approver_gids)
        )
        if batch is None or not allowed:
            self.shared.error(
                session.peer, message.id, ProtocolErrorCode.UNKNOWN_BATCH, f"no batch {message.batch_id!r}"
            )
            return
        call = next((c for c in batch.calls if c.call_id == message.call_id), None)
        if call is None or not call.awaiting_result or call.supplied is not None:
            self.shared.error(
                session.peer,
                message.id,
                ProtocolErrorCode.INVALID_MESSAGE,
                f"call {message.call_id[:128]!r} of batch {message.batch_id!r} is not waiting for a result",
            )
            return
        limits = self.shared.config.tools.output
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
        self.shared.reply(session, Ack(id=message.id))


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
