"""Where frames from the daemon go once received, for the sync and the async client alike.

One connection carries replies (matched to requests by ``id``), events of batches
(kept per batch until that batch is waited on, so nothing is lost whichever order the
caller asks in), confirmation requests (for approvers) and, after ``watch``, every
unsolicited message in arrival order. ``Inbox`` sorts them; the clients only decide
how to wait for the next frame.
"""

from __future__ import annotations

import collections
from typing import TypeVar

from toold_protocol import (
    BatchStatus,
    ConfirmationRequested,
    DaemonMessage,
    DecodeFailure,
    Error,
    decode_daemon_message,
)

from ._errors import ProtocolError, RemoteError

T = TypeVar("T")
_BATCH_EVENT_TYPES = ("call_started", "output_chunk", "call_finished", "batch_finished", "confirmation_requested")


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


def expect(message: DaemonMessage, kind: type[T]) -> T:
    if not isinstance(message, kind):
        raise ProtocolError(f"expected {kind.__name__}, got {type(message).__name__}")
    return message
