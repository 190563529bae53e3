"""A batch in the daemon: its planned calls, its results so far, its state.

The executor fills ``results`` in call order; ``results[i] is None`` means call ``i``
has not finished. Exactly one result per call is the invariant every path keeps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from toold_protocol import BatchFinished, BatchState, BatchStatus, Disposition, Identity, PlannedCall, ToolResult

from ..sandbox import Sandbox
from ..tools._base import Tool, ToolContext


class PreparedCall(msgspec.Struct):
    """A call after planning: the decoded arguments are the single source of truth."""

    index: int
    call_id: str
    name: str
    tool: Tool[Any] | None
    args: Any
    summary: str = ""
    risk: str = "low"
    locations: list[str] = msgspec.field(default_factory=list)
    result: ToolResult | None = None  # set when pre-resolved by the planner
    resolved: dict[str, Path] = msgspec.field(default_factory=dict)  # path argument -> canonical path
    needs_confirmation: bool = False  # the policy asks; a person answers before the batch runs
    awaiting_result: bool = False  # parse-only mode: waits for a person's supply_result
    supplied: ToolResult | None = None
    supplied_event: trio.Event = msgspec.field(default_factory=trio.Event)
    policy_reason: str = ""  # why the policy decided as it did (toolctl policy explain)
    policy_rule: int | None = None
    denial: ToolResult | None = None  # the result of a call a person denied (journaled when reached)
    changes: list[Any] = msgspec.field(
        default_factory=list
    )  # what it did to each path (undo), journaled with its result
    undo_bytes: int = 0  # what its pre-images took in the undo store (counted in the journal's share)
    started_recorded: bool = False  # its started mark went into the journal with the batch
    decision: str = ""  # what the policy made of it when it was planned (see policy_decision)
    context: ToolContext | None = None  # made early by ``Executor.begin``; taken when the call runs
    begun_at: float = 0.0  # when ``Executor.begin`` sent it on its way (time.monotonic)

    def policy_decision(self) -> tuple[str, str]:
        """What the policy made of this call as planned, and why: allow, ask, deny, pending
        (parse-only mode: a person supplies the result) or invalid (cannot be planned)."""
        if self.result is not None:
            error = self.result.error
            if error is not None and error.type == "Denied":
                return "deny", self.policy_reason or error.message
            return "invalid", error.message if error is not None else self.policy_reason
        if self.awaiting_result:
            return "pending", self.policy_reason
        return ("ask" if self.needs_confirmation else "allow"), self.policy_reason

    @property
    def disposition(self) -> Disposition:
        if self.result is not None:
            return "resolved"
        if self.awaiting_result:
            return "pending"
        return "confirm" if self.needs_confirmation else "run"

    def marked_dry(self) -> PreparedCall:
        """In a dry run: a call refused at planning says so in its result's ``data`` too."""
        if self.result is not None:
            error = self.result.error
            policy = "deny" if error is not None and error.code == "DENIED_BY_POLICY" else "error"
            data = {**(self.result.data or {}), "dry_run": True, "policy": policy}
            self.result = msgspec.structs.replace(self.result, data=data)
        return self

    def planned(self) -> PlannedCall:
        return PlannedCall(
            index=self.index,
            call_id=self.call_id,
            name=self.name,
            disposition=self.disposition,
            summary=self.summary,
            risk=self.risk,  # type: ignore[arg-type]
            locations=self.locations,
            result=self.result,
        )


class Batch(msgspec.Struct):
    batch_id: str
    identity: Identity
    session_id: str
    calls: list[PreparedCall]
    results: list[ToolResult | None]
    umask: int = 0o077  # the session's: what its calls make gets these modes
    state: BatchState = "planned"
    cancel_reason: str | None = None
    current_scope: trio.CancelScope | None = None
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    digest: str = ""  # journal.fingerprint of the submitted calls: same id + same digest = same batch
    listeners: list[tuple[bytes, bool]] = msgspec.field(default_factory=list)  # (peer, wants per-call events)
    approval_timeout: float | None = None  # the submitter's override of approval.timeout_seconds
    sandbox: Sandbox | None = None  # the session's workspace; None: the daemon's roots
    dry_run: bool = False  # plan, judge and preview every call; change nothing
    undo_bytes: int = 0  # pre-image bytes kept so far ([journal] undo_max_bytes_per_batch)
    journaled_at_end: bool = False  # read-only: one journal write when it ends, none per call
    observed: set[int] = msgspec.field(default_factory=set)  # calls whose result the audit and metrics have seen
    kept_bytes: int = 0  # what it holds (arguments, results), once it has finished and is kept for get_batch
    argument_bytes: int = 0  # its calls' arguments as submitted (encoded)
    #: (call, host, port) -> (allowed, why): asks a person about a command's new host.
    ask_network: Callable[[PreparedCall, str, int], Awaitable[tuple[bool, str]]] | None = None

    @property
    def read_only(self) -> bool:
        """Nothing this batch can run changes anything: a dry run, or only read-only tools
        (no supplied results either). Its journal writes need not be awaited."""
        if self.dry_run:
            return True
        return all(call.result is not None or _reads_only(call) for call in self.calls)

    def runs_at_once(self) -> PreparedCall | None:
        """The batch's first call when it is side-effecting and runs as soon as the batch is
        accepted (nothing to confirm or supply first): its started mark can share the batch's
        journal transaction instead of costing a commit of its own."""
        if self.dry_run or any(c.needs_confirmation or c.awaiting_result for c in self.calls):
            return None
        first = next((c for c in self.calls if c.result is None), None)
        if first is None or first.denial is not None or first.tool is None or not first.tool.side_effecting:
            return None
        return first

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.current_scope is not None:
            self.current_scope.cancel()

    def finished_results(self) -> list[ToolResult]:
        return [r for r in self.results if r is not None]

    def plan(self) -> list[PlannedCall]:
        return [call.planned() for call in self.calls]

    def status(self, request_id: int) -> BatchStatus:
        """``get_batch``'s answer (request id 0: the announcement a watcher gets)."""
        results = self.finished_results()
        return BatchStatus(id=request_id, batch_id=self.batch_id, state=self.state, calls=self.plan(), results=results)

    def result_bytes(self) -> int:
        """About what its results hold: their texts and their structured data, encoded."""
        total = 0
        for result in self.results:
            if result is not None:
                total += len(result.content) + (len(result.error.message) if result.error is not None else 0)
                total += len(msgspec.msgpack.encode(result.data)) if result.data else 0
        return total

    def outcome(self) -> BatchFinished:
        return BatchFinished(batch_id=self.batch_id, state=self.state, results=self.finished_results())


def _reads_only(call: PreparedCall) -> bool:
    return call.tool is not None and not call.tool.side_effecting and not call.awaiting_result
