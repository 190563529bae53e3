"""``batch_accepted`` held back for a moment, so that a quick batch answers in one go.

A client that asked only for results (``events="results"``) waits for ``batch_finished``;
``batch_accepted`` alone wakes it for nothing. For a batch of one call that needs no
person (a read usually finishes in well under a millisecond, ``shell true`` in about
two), the daemon holds the acceptance until the batch finishes and sends both frames
together (one wake-up of the client instead of two, one send fewer for the loop), or
sends it alone once ``HOLD_SECONDS`` have passed, so that a long call's client still
learns the batch id in time to cancel it. A side-effecting call's acceptance is sent
only once its batch is journaled: held when the journal took it at once, else sent
when the journal has it. A client that said it reads
``batch_accepted.outcome`` gets one frame: the acceptance carrying the outcome.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import trio

from toold_protocol import BatchFinished

HOLD_SECONDS = 0.02

#: Sends a held acceptance; given the batch's outcome, it may carry it (then it returns
#: True, and the outcome must not be sent to that client again).
SendAcceptance = Callable[[BatchFinished | None], bool]


class HeldAccepts:
    def __init__(self) -> None:
        self._held: collections.OrderedDict[str, tuple[float, SendAcceptance]] = collections.OrderedDict()
        self._changed = trio.Event()

    def hold(self, batch_id: str, send: SendAcceptance) -> None:
        """Hold the acceptance; ``watch`` once the batch is under way sees to it that it
        goes out when due. (A batch that ended meanwhile released it already: nothing
        wakes the task that sends the due ones, a trip through the scheduler per read.)"""
        self._held[batch_id] = (trio.current_time() + HOLD_SECONDS, send)

    def watch(self) -> None:
        """Have what is held sent when due."""
        if self._held:
            self._changed.set()

    def release(self, batch_id: str, outcome: BatchFinished | None = None) -> bool:
        """Send the batch's acceptance now, if it is still held; True if it carried ``outcome``."""
        held = self._held.pop(batch_id, None)
        return held is not None and held[1](outcome)

    def forget(self, batch_id: str) -> None:
        """Never send the batch's acceptance (its submission failed after it was held)."""
        self._held.pop(batch_id, None)

    async def send_when_due(self) -> None:
        """Send each acceptance that has been held for ``HOLD_SECONDS`` (runs until cancelled)."""
        while True:
            if not self._held:
                self._changed = trio.Event()
                await self._changed.wait()
                continue
            batch_id, (due, _) = next(iter(self._held.items()))  # held in order, so due in order
            await trio.sleep_until(due)
            self.release(batch_id)
