"""Batch ids the daemon makes: ordered by time, unique in this process, unguessable enough."""

from __future__ import annotations

import secrets
import time


class _Microseconds:
    """The current time in microseconds, never the same value twice in this process."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last = max(time.time_ns() // 1000, self._last + 1)
        return self._last


class _RandomTails:
    """Six random bytes at a time from the kernel's generator, fetched 4 KiB at once: one
    ``getrandom`` per 680 ids instead of one per id, with the same randomness."""

    def __init__(self) -> None:
        self._pool = b""
        self._used = 0

    def next(self) -> str:
        if self._used + 6 > len(self._pool):
            self._pool, self._used = secrets.token_bytes(4096), 0
        self._used += 6
        return self._pool[self._used - 6 : self._used].hex()


_batch_clock = _Microseconds()
_random_tails = _RandomTails()


def new_batch_id() -> str:
    """24 hex digits: the time in microseconds (it wraps every 8.9 years) first, then 48
    random bits (an id is not a secret: other users' batches look unknown). Ids made one
    after another sort one after another, so the journal's indexes grow at their end
    (a few pages written per commit instead of one random page per batch and index).
    Two ids made in the same microsecond (or after the clock stepped back) take the next
    free microsecond, so the order holds for every id this process makes."""
    return f"{_batch_clock.next() % 16**12:012x}{_random_tails.next()}"
