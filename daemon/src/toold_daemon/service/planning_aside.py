"""Planning a batch that is costly to plan on a thread, so the event loop serves meanwhile.

Planning runs every call's checks: decoding, the tool's validation, the sandbox check of
each path, reading a shell command, parsing a patch. Their cost grows with the
arguments, and a batch may carry megabytes of them: a patch of 256 KB takes about 20 ms
to check, one that adds 6,000 files 150 ms, eight such calls a frame more than a second,
all of it time in which the loop served nobody. A batch whose arguments pass
``COSTLY_ARGUMENT_BYTES`` is therefore planned on a thread. The loop still shares the
interpreter with it, but takes its turn at least every switch interval (5 ms) instead of
waiting for the whole plan. Each uid plans one such batch at a time, on at most
``THREADS`` threads together, with at most ``WAITING_PER_UID`` waiting: a user's
costly batches queue behind their own, not behind everyone's.

A batch whose paths the kernel has not cached is planned aside too (``WouldBlock``, see
``sandbox.lookups``): its lookups may wait for a filesystem, maybe for good (a stopped FUSE
server, an NFS server gone). So there are two lanes. A costly plan computes on one of
``THREADS`` threads, its lookups from the kernel's caches alone, as on the loop; one that
would wait for a disk there, and every cheap plan sent aside because it would, waits on a
thread outside that pool. A thread waiting so holds no CPU, and each uid holds at most one
(its turn): the users whose disks hang hold their own plans, never a thread another
user's costly plan needs. (With a single bounded pool, eight users with hung disks held
every thread, and everyone's large or cold-cache batches waited for those disks.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import trio

from ..sandbox.lookups import WouldBlock, from_the_caches_alone

#: Arguments (MessagePack bytes, all calls together) past which a batch is planned aside.
COSTLY_ARGUMENT_BYTES = 16 * 1024
#: Costly plans computing at once (the waits for disks are not counted).
THREADS = 8
#: Costly batches of one uid planned or waiting to be; past it one more is refused.
WAITING_PER_UID = 8

T = TypeVar("T")


class PlanningAside:
    def __init__(self) -> None:
        self._computing = trio.CapacityLimiter(THREADS)
        # One thread per uid at most (its turn), so not bounded here: bounding it would let
        # the uids whose disks hang hold every thread.
        self._waiting_for_disks = trio.CapacityLimiter(math.inf)
        self._turns: dict[int, trio.Lock] = {}  # one plan aside at a time per uid
        self._waiting: dict[int, int] = {}

    def admits(self, uid: int) -> bool:
        return self._waiting.get(uid, 0) < WAITING_PER_UID

    def waiting(self, uid: int) -> int:
        return self._waiting.get(uid, 0)

    async def plan_soon(self, uid: int, plan: Callable[[], T], *, costly: bool) -> T:
        """``plan`` here on the event loop when it is cheap and every lookup it makes is
        in the kernel's caches, else on a thread (``plan``)."""
        if not costly:
            try:
                with from_the_caches_alone():
                    return plan()
            except WouldBlock:
                pass
        return await self.plan(uid, plan, costly=costly)

    async def plan(self, uid: int, plan: Callable[[], T], *, costly: bool) -> T:
        """Run ``plan`` on a thread once it is ``uid``'s turn: a ``costly`` one on the
        computing lane while its lookups need no disk, any other on the waiting lane."""
        self._waiting[uid] = self._waiting.get(uid, 0) + 1
        turn = self._turns.setdefault(uid, trio.Lock())
        try:
            async with turn:
                if costly:
                    try:
                        return await self._on_a_thread(_from_the_caches_alone(plan), self._computing)
                    except WouldBlock:  # planned again from the start, where it may wait
                        pass
                return await self._on_a_thread(plan, self._waiting_for_disks)
        finally:
            left = self._waiting[uid] - 1
            if left:
                self._waiting[uid] = left
            else:  # nobody else holds or waits for this uid's turn
                del self._waiting[uid]
                del self._turns[uid]

    @staticmethod
    async def _on_a_thread(plan: Callable[[], T], lane: trio.CapacityLimiter) -> T:
        # Abandoned when cancelled (the daemon stopping): a plan changes nothing, and one
        # waiting for a filesystem that never answers must not hold the stop.
        return await trio.to_thread.run_sync(plan, limiter=lane, abandon_on_cancel=True)


def _from_the_caches_alone(plan: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        with from_the_caches_alone():
            return plan()

    return run
