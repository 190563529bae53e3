"""The requests a client sends, built once for the sync and the async client alike.

Each function returns a ``Request``: the message type and its fields, given its
request id when sent (``Request.build``). Also the request-side value types
(``CallSpec``, ``Decision``) and how a call is put on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from toold_protocol import (
    PROTOCOL_VERSION,
    Cancel,
    Confirm,
    EventMode,
    ExplainPolicy,
    GetBatch,
    GetStats,
    Hello,
    ListBatches,
    ListConnections,
    ListTools,
    Ping,
    PruneJournal,
    Recover,
    ReloadPolicy,
    SubmitBatch,
    Subscribe,
    SupplyResult,
    ToolCall,
    UndoBatch,
    encode_value,
)


@dataclass(frozen=True, slots=True)
class Request:
    """A request waiting for its id."""

    kind: type[msgspec.Struct]
    fields: dict[str, Any] = field(default_factory=dict)

    def build(self, request_id: int) -> msgspec.Struct:
        return self.kind(id=request_id, **self.fields)


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One call to submit. ``arguments`` is a JSON-like mapping."""

    name: str
    arguments: Mapping[str, Any]
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """An answer to a confirmation request. ``approve_selected`` approves only
    ``approved_call_ids``; ``modified_arguments`` replaces a call's arguments (the daemon
    re-validates them); ``remember_for_session`` grants the same tool and path (or the
    same program, for shell) for the rest of the submitting session;
    ``remember_for_workspace`` (a command's new network host) allows that host in this
    workspace from now on."""

    decision: Literal["approve_all", "approve_selected", "deny_all"]
    approved_call_ids: tuple[str, ...] = ()
    modified_arguments: Mapping[str, Mapping[str, Any]] | None = None
    remember_for_session: bool = False
    reason: str = ""
    remember_for_workspace: bool = False


APPROVE_ALL = Decision("approve_all")
DENY_ALL = Decision("deny_all")


def hello(client_name: str, workspace: str, umask: int | None = None) -> Request:
    fields = {"protocol_version": PROTOCOL_VERSION, "client_name": client_name, "workspace": workspace, "umask": umask}
    return Request(Hello, fields)


def own_umask() -> int | None:
    """This process's umask, read without changing it (``os.umask`` would, for a moment,
    for every thread); None where the kernel does not show it."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def ping() -> Request:
    return Request(Ping)


def list_tools(format: str) -> Request:
    return Request(ListTools, {"format": format})


def submit(
    calls: list[ToolCall],
    batch_id: str | None,
    events: EventMode,
    approval_timeout: float | None,
    *,
    dry_run: bool = False,
    umask: int | None = None,
) -> Request:
    fields = {
        "umask": umask,
        "calls": calls,
        "batch_id": batch_id,
        "events": events,
        "approval_timeout_seconds": approval_timeout,
        "dry_run": dry_run,
        "outcome_in_acceptance": True,  # both clients read a batch_accepted that carries it
    }
    return Request(SubmitBatch, fields)


def undo(batch_id: str, force: bool, events: EventMode, approval_timeout: float | None) -> Request:
    fields = {"batch_id": batch_id, "force": force, "events": events, "approval_timeout_seconds": approval_timeout}
    return Request(UndoBatch, fields)


def confirm(correlation_id: str, decision: Decision) -> Request:
    """The ``confirm`` request answering ``correlation_id`` with ``decision``."""
    modified = {k: msgspec.Raw(encode_value(dict(v))) for k, v in (decision.modified_arguments or {}).items()}
    return Request(
        Confirm,
        {
            "correlation_id": correlation_id,
            "decision": decision.decision,
            "approved_call_ids": list(decision.approved_call_ids),
            "modified_arguments": modified,
            "remember_for_session": decision.remember_for_session,
            "remember_for_workspace": decision.remember_for_workspace,
            "reason": decision.reason,
        },
    )


def subscribe() -> Request:
    return Request(Subscribe)


def supply_result(batch_id: str, call_id: str, content: str, ok: bool) -> Request:
    return Request(SupplyResult, {"batch_id": batch_id, "call_id": call_id, "ok": ok, "content": content})


def explain(name: str, arguments: Mapping[str, Any] | None) -> Request:
    return Request(ExplainPolicy, {"name": name, "arguments": msgspec.Raw(encode_value(dict(arguments or {})))})


def reload_policy() -> Request:
    return Request(ReloadPolicy)


def stats() -> Request:
    return Request(GetStats)


def cancel(batch_id: str) -> Request:
    return Request(Cancel, {"batch_id": batch_id})


def get_batch(batch_id: str) -> Request:
    return Request(GetBatch, {"batch_id": batch_id})


def list_batches(limit: int) -> Request:
    return Request(ListBatches, {"limit": limit})


def list_connections(server: str | None, limit: int) -> Request:
    return Request(ListConnections, {"server": server, "limit": limit})


def recover(batch_id: str, action: Literal["resume", "discard"]) -> Request:
    return Request(Recover, {"batch_id": batch_id, "action": action})


def prune(older_than_seconds: float) -> Request:
    return Request(PruneJournal, {"older_than_seconds": older_than_seconds})


def to_wire(call: CallSpec | Mapping[str, Any], index: int) -> ToolCall:
    """A call as sent. Arguments that are not an object (a provider's malformed JSON
    string, say) are sent as they are: the daemon answers that call with BadArgs."""
    if not isinstance(call, CallSpec):
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json_or_text(arguments)
        call = CallSpec(str(call.get("name", "")), arguments, str(call.get("id") or call.get("call_id") or ""))
    # Deterministic, so that resubmitting the same calls under the same batch id is the same batch.
    call_id = call.call_id or f"call_{index}"
    arguments = dict(call.arguments) if isinstance(call.arguments, Mapping) else call.arguments
    return ToolCall(call_id=call_id, name=call.name, arguments=msgspec.Raw(encode_value(arguments)))


def json_or_text(text: str) -> Any:
    """JSON text decoded; text that is not JSON stays the string it was."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text
