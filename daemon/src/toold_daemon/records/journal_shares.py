"""Each uid's share of the journal: what its batches hold, and which of them to prune
once the uid is past its share.

What a batch holds (its calls' arguments, its results, the pre-images kept for undo) is
counted as its rows are queued, so a uid's total is known at once, committed or not. The
batches that ended while the daemon ran are remembered in the order they ended, with
their sizes: a flood's newest batches may still wait for the writer thread, and pruning
chooses among what is remembered, never from what happens to be committed yet. Older
batches (from before the daemon started, or forgotten past ``REMEMBERED_PER_UID``) are
asked of the database, oldest first, up to where the remembered ones begin; a mark says
how far that went, so none is chosen twice.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import msgspec

#: Batches chosen at once (each prune is one short write).
PRUNE_AT_ONCE = 256
#: Ended batches remembered per uid; older ones are found in the database.
REMEMBERED_PER_UID = 10_000

#: (uid, after, before, limit) -> (batch_id, bytes, finished) of the uid's finished batches
#: that ended in that window, oldest first.
Older = Callable[[int, float, float, int], list[tuple[str, int, float]]]


class _Share(msgspec.Struct):
    held: int = 0
    ended: deque[tuple[str, int, float]] = msgspec.field(default_factory=deque)  # (batch, bytes, finished)
    chosen_up_to: float = -math.inf  # older batches asked of the database: chosen up to here
    look_again_at: int = 0  # past the share with nothing to prune: look again once held reaches this


class Shares:
    def __init__(self, most_per_uid: int, held: dict[int, int]) -> None:
        self.most_per_uid = most_per_uid
        self._shares = {uid: _Share(held=size) for uid, size in held.items()}
        self._open: dict[str, tuple[int, int]] = {}  # recorded, not ended: (uid, bytes so far)

    def held_by(self, uid: int) -> int:
        share = self._shares.get(uid)
        return share.held if share is not None else 0

    def recorded(self, batch_id: str, uid: int, size: int, *, ended_at: float | None) -> None:
        """A batch's first rows: ``ended_at`` when it is journaled once it has ended."""
        self._share(uid).held += size
        if ended_at is None:
            self._open[batch_id] = (uid, size)
        else:
            self._remember(uid, batch_id, size, ended_at)

    def added(self, batch_id: str, size: int, *, uid: int | None = None) -> int | None:
        """More rows of an open batch (a result): its uid, or ``uid`` for a batch recorded
        before this start (not known here); None when neither says whose it is."""
        opened = self._open.get(batch_id)
        if opened is not None:
            uid = opened[0]
            self._open[batch_id] = (uid, opened[1] + size)
        if uid is not None:
            self._share(uid).held += size
        return uid

    def ended(self, batch_id: str, finished: float) -> None:
        opened = self._open.pop(batch_id, None)
        if opened is not None:
            self._remember(opened[0], batch_id, opened[1], finished)

    def is_open(self, batch_id: str) -> bool:
        return batch_id in self._open

    def over(self, uid: int) -> bool:
        share = self._shares.get(uid)
        return share is not None and share.held > self.most_per_uid and share.held >= share.look_again_at

    def choose(self, uid: int, older: Older) -> list[str]:
        """The uid's oldest ended batches to prune, down to three quarters of its share (at
        most ``PRUNE_AT_ONCE``), taken off its total now; none when nothing has ended."""
        share = self._share(uid)
        target = self.most_per_uid * 3 // 4
        chosen: list[str] = []
        before = share.ended[0][2] if share.ended else math.inf
        for batch_id, size, finished in older(uid, share.chosen_up_to, before, PRUNE_AT_ONCE):
            if share.held <= target:
                break
            chosen.append(batch_id)
            share.held -= size
            share.chosen_up_to = finished
        while share.ended and share.held > target and len(chosen) < PRUNE_AT_ONCE:
            batch_id, size, finished = share.ended.popleft()
            chosen.append(batch_id)
            share.held -= size
            # the database must not offer it again while its delete waits for the writer
            share.chosen_up_to = max(share.chosen_up_to, finished)
        share.look_again_at = 0 if chosen else share.held + self.most_per_uid // 16
        return chosen

    def pruned(self, freed: list[tuple[int, int]], removed: set[str]) -> None:
        """Batches pruned otherwise (retention, ``toolctl journal prune``): ``freed`` per uid."""
        for uid, size in freed:
            self._share(uid).held -= size
        for share in self._shares.values():
            if any(batch_id in removed for batch_id, _, _ in share.ended):
                share.ended = deque(entry for entry in share.ended if entry[0] not in removed)

    def _share(self, uid: int) -> _Share:
        share = self._shares.get(uid)
        if share is None:
            share = self._shares[uid] = _Share()
        return share

    def _remember(self, uid: int, batch_id: str, size: int, finished: float) -> None:
        ended = self._share(uid).ended
        ended.append((batch_id, size, finished))
        if len(ended) > REMEMBERED_PER_UID:
            ended.popleft()  # found in the database when its turn comes (it ended before the rest)
