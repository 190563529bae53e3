"""Where frames from the daemon go once received, for the sync and the async client alike.

One connection carries replies (matched to requests by ``id``), events of batches
(kept per batch until that batch is waited on, so nothing is lost whichever order the
caller asks in), confirmation requests (for approvers) and, after ``watch``, every
unsolicited message in arrival order. ``Inbox`` sorts them; the clients only decide
how to wait for the next frame.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from toold_protocol import (
    BatchStatus,
    Confirm,
    ConfirmationRequested,
    DaemonMessage,
    DecodeFailure,
    Error,
    EventMode,
    SubmitBatch,
    ToolCall,
    decode_daemon_message,
    encode_value,
)

from ._errors import ProtocolError, RemoteError

T = TypeVar("T")
_BATCH_EVENT_TYPES = ("call_started", "output_chunk", "call_finished", "batch_finished", "confirmation_requested")


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
    same program, for shell) for the rest of the submitting session."""

    decision: Literal["approve_all", "approve_selected", "deny_all"]
    approved_call_ids: tuple[str, ...] = ()
    modified_arguments: Mapping[str, Mapping[str, Any]] | None = None
    remember_for_session: bool = False
    reason: str = ""


APPROVE_ALL = Decision("approve_all")
DENY_ALL = Decision("deny_all")


class Inbox:
    """Sorts decoded daemon messages into replies, per-batch events, confirmations and
    (after ``watch``) the watch queue. Bounded where a peer could make it grow."""

    def __init__(self, uid: int) -> None:
        self.uid = uid  # the daemon namespaces batch ids a client chooses by its uid
        self.replies: dict[int, DaemonMessage] = {}
        self.events: dict[str, collections.deque[DaemonMessage]] = collections.defaultdict(collections.deque)
        self.confirmations: collections.deque[ConfirmationRequested] = collections.deque(maxlen=1000)
        self.watching = False
        self.watch_queue: collections.deque[DaemonMessage] = collections.deque(maxlen=10_000)
        self.unwanted: set[int] = set()  # requests whose reply nobody waits for any more

    def deliver(self, frame: bytes) -> None:
        """Decode one frame and file it. An unsolicited ``error`` (no request id) raises."""
        try:
            message = decode_daemon_message(frame)
        except DecodeFailure as exc:
            raise ProtocolError(f"undecodable frame from the daemon: {exc.message}") from None
        tag = type(message).__struct_config__.tag
        unsolicited = tag in _BATCH_EVENT_TYPES or (isinstance(message, BatchStatus) and message.id == 0)
        if self.watching and unsolicited:
            self.watch_queue.append(message)
            if isinstance(message, ConfirmationRequested):
                self.confirmations.append(message)
        elif isinstance(message, ConfirmationRequested):
            self.confirmations.append(message)
            self.events[message.batch_id].append(message)
        elif tag in _BATCH_EVENT_TYPES:
            self.events[message.batch_id].append(message)  # type: ignore[union-attr]
        elif isinstance(message, Error) and message.id is None:
            raise RemoteError(message.code, message.message, message.details)
        elif message.id in self.unwanted:  # type: ignore[union-attr,operator]
            self.unwanted.discard(message.id)  # type: ignore[union-attr]
        else:
            self.replies[message.id] = message  # type: ignore[union-attr,index]

    def take_reply(self, request_id: int) -> DaemonMessage | None:
        """The reply to this request if it has come; an ``error`` reply raises RemoteError."""
        reply = self.replies.pop(request_id, None)
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message, reply.details)
        return reply

    def batch_names(self, batch_id: str) -> list[str]:
        """The ids this batch's events may carry: a chosen id comes back as ``uid:id``."""
        return [batch_id] if batch_id.startswith(f"{self.uid}:") else [batch_id, f"{self.uid}:{batch_id}"]

    def next_batch_event(self, names: list[str]) -> DaemonMessage | None:
        queue = next((self.events[n] for n in names if self.events.get(n)), None)
        return queue.popleft() if queue is not None else None

    def forget_batch(self, names: list[str]) -> None:
        for name in names:
            self.events.pop(name, None)

    def start_watching(self) -> None:
        """Watch mode on; confirmation requests already returned by ``subscribe`` are not repeated."""
        self.watching = True
        kept = [m for m in self.watch_queue if not isinstance(m, ConfirmationRequested)]
        self.watch_queue.clear()
        self.watch_queue.extend(kept)


def submit_request(
    calls: list[ToolCall], batch_id: str | None, events: EventMode, approval_timeout: float | None
) -> Any:
    """A builder of the ``submit_batch`` request for a request id."""
    return lambda i: SubmitBatch(
        id=i, calls=calls, batch_id=batch_id, events=events, approval_timeout_seconds=approval_timeout
    )


def confirm_request(correlation_id: str, decision: Decision) -> Any:
    """A builder of the ``confirm`` request answering ``correlation_id`` with ``decision``."""
    modified = {k: msgspec.Raw(encode_value(dict(v))) for k, v in (decision.modified_arguments or {}).items()}
    return lambda i: Confirm(
        id=i,
        correlation_id=correlation_id,
        decision=decision.decision,
        approved_call_ids=list(decision.approved_call_ids),
        modified_arguments=modified,
        remember_for_session=decision.remember_for_session,
        reason=decision.reason,
    )


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


def expect(message: DaemonMessage, kind: type[T]) -> T:
    if not isinstance(message, kind):
        raise ProtocolError(f"expected {kind.__name__}, got {type(message).__name__}")
    return message
