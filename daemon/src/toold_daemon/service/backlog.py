"""Bytes the daemon holds for clients that have not read them yet, per connection and per uid.

A reply waits in one of two places: the daemon's own outbox (``queued``, counted exactly),
or inside libzmq and the kernel once handed over (``in_flight``). libzmq bounds its pipe
in frames, not bytes, so a client that submits and never reads could make it hold any
number of large outcomes. The daemon therefore hands a connection more only while its
``in_flight`` is small or the connection is seen reading (its kernel send queue near
empty); everything else waits in the outbox, where it is counted. Both count against the
connection's uid, so that one user's many connections share one bound.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class Holding(msgspec.Struct):
    uid: int
    queued: int = 0  # bytes in the daemon's outbox
    in_flight: int = 0  # bytes handed to libzmq since the connection was last seen reading


class Backlogs:
    """What each connection and each uid has waiting, with the bounds that end a connection."""

    def __init__(self, max_peer_queued: int, max_uid_held: int, seen_reading: Callable[[bytes], bool]) -> None:
        self.max_peer_queued = max_peer_queued
        self.max_uid_held = max_uid_held
        #: Whether a connection is reading now (its kernel send queue near empty).
        self.seen_reading = seen_reading
        self._peers: dict[bytes, Holding] = {}
        self._uid_held: dict[int, int] = {}

    def connected(self, peer: bytes, uid: int) -> None:
        """Start counting for ``peer`` (again: what it still holds is kept, unless the id now
        belongs to another uid's connection, which is never charged with the old one's)."""
        holding = self._peers.get(peer)
        if holding is not None and holding.uid != uid:
            self.gone(peer)
            holding = None
        if holding is None:
            self._peers[peer] = Holding(uid)

    def queued(self, peer: bytes) -> int:
        holding = self._peers.get(peer)
        return holding.queued if holding is not None else 0

    def in_flight(self, peer: bytes) -> int:
        holding = self._peers.get(peer)
        return holding.in_flight if holding is not None else 0

    def uid_held(self, uid: int) -> int:
        return self._uid_held.get(uid, 0)

    def held_by_uid(self) -> dict[int, int]:
        """Bytes waiting for each uid's clients, those seen reading recounted first (a copy)."""
        self._recount_readers(None)
        return dict(self._uid_held)

    def refusal(self, peer: bytes, size: int) -> str | None:
        """Why ``size`` more bytes may not wait for ``peer`` (None: they may). A connection,
        or a uid, holding nothing always gets one frame, however large."""
        holding = self._peers.get(peer)
        if holding is None:
            return None
        if holding.queued and holding.queued + size > self.max_peer_queued:
            return f"more than {self.max_peer_queued} bytes waited for this client"
        if self._over_uid_bound(holding.uid, size):
            self._recount_readers(holding.uid)  # bytes read since they were handed over are not held
            if self._over_uid_bound(holding.uid, size):
                return f"more than {self.max_uid_held} bytes waited for this user's clients"
        return None

    def _over_uid_bound(self, uid: int, size: int) -> bool:
        held = self._uid_held.get(uid, 0)
        return bool(held) and held + size > self.max_uid_held

    def _recount_readers(self, uid: int | None) -> None:
        """Forget what the connections of ``uid`` (None: all) seen reading were handed."""
        for peer, holding in list(self._peers.items()):
            if (uid is None or holding.uid == uid) and holding.in_flight and self.seen_reading(peer):
                self.reading(peer)

    def add_queued(self, peer: bytes, size: int) -> None:
        holding = self._peers.get(peer)
        if holding is not None:
            holding.queued += size
            self._add(holding.uid, size)

    def handed_over(self, peer: bytes, size: int) -> None:
        """``size`` queued bytes went to libzmq: they still wait, elsewhere."""
        holding = self._peers.get(peer)
        if holding is not None:
            holding.queued -= size
            holding.in_flight += size

    def reading(self, peer: bytes) -> None:
        """The connection is seen reading: what libzmq had for it is on its way."""
        holding = self._peers.get(peer)
        if holding is not None and holding.in_flight:
            self._add(holding.uid, -holding.in_flight)
            holding.in_flight = 0

    def drop_queued(self, peer: bytes) -> None:
        """The outbox for ``peer`` was dropped; what libzmq holds for it stays counted."""
        holding = self._peers.get(peer)
        if holding is not None and holding.queued:
            self._add(holding.uid, -holding.queued)
            holding.queued = 0

    def gone(self, peer: bytes) -> None:
        """The connection is closed: nothing waits for it any more."""
        holding = self._peers.pop(peer, None)
        if holding is not None:
            self._add(holding.uid, -(holding.queued + holding.in_flight))

    def _add(self, uid: int, size: int) -> None:
        held = self._uid_held.get(uid, 0) + size
        if held:
            self._uid_held[uid] = held
        else:
            self._uid_held.pop(uid, None)
