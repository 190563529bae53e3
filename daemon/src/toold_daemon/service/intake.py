"""Frames read from the socket and waiting for their turn: one queue per uid, served in rotation.

libzmq hands a ROUTER's frames over fairly per connection, so a user with a hundred
connections, each with requests queued, got a hundred turns for every one of another
user's: the other user's call waited behind all of them. The pump now reads what libzmq
holds into these queues and serves one frame per uid in turn, so that a user's request
waits for at most one frame of each other user that has some waiting, however many
connections they use. A connection's own frames keep their order (they are one uid's).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, TypeVar

Frame = TypeVar("Frame")


class Intake(Generic[Frame]):
    """Frames of each uid in arrival order, and the uids with frames in serving order."""

    def __init__(self, peer_of: Callable[[Frame], bytes]) -> None:
        self._peer_of = peer_of
        self._queues: dict[int, collections.deque[tuple[Frame, int]]] = {}
        self._turns: collections.deque[int] = collections.deque()
        self.waiting = 0  # frames in every queue
        self.bytes = 0  # what they hold, as their adders said

    def __bool__(self) -> bool:
        return self.waiting > 0

    def add(self, uid: int, frame: Frame, size: int) -> None:
        queue = self._queues.get(uid)
        if queue is None:
            queue = self._queues[uid] = collections.deque()
            self._turns.append(uid)
        queue.append((frame, size))
        self.waiting += 1
        self.bytes += size

    def take(self) -> Frame:
        """The next uid's oldest frame; that uid goes to the back of the line."""
        uid = self._turns.popleft()
        queue = self._queues[uid]
        frame, size = queue.popleft()
        if queue:
            self._turns.append(uid)
        else:
            del self._queues[uid]
        self.waiting -= 1
        self.bytes -= size
        return frame

    def holds(self, uid: int, peer: bytes) -> bool:
        """Whether ``peer`` (a connection of ``uid``) has frames waiting."""
        return any(self._peer_of(frame) == peer for frame, _ in self._queues.get(uid, ()))

    def drop(self, uid: int, peer: bytes) -> None:
        """Forget what ``peer`` (a connection of ``uid``) sent and nobody has served: it
        is gone, or its routing id now belongs to another connection."""
        queue = self._queues.get(uid)
        if queue is None:
            return
        kept = collections.deque(entry for entry in queue if self._peer_of(entry[0]) != peer)
        self.waiting -= len(queue) - len(kept)
        self.bytes -= sum(size for _, size in queue) - sum(size for _, size in kept)
        if kept:
            self._queues[uid] = kept
        else:
            del self._queues[uid]
            self._turns.remove(uid)
