"""``batch_accepted`` held for a quick batch: sent with the result, or alone once due
(on trio's mock clock, so the timings are exact)."""

from __future__ import annotations

import trio
import trio.testing

from toold_daemon import held_accepts
from toold_daemon.held_accepts import HeldAccepts


async def test_a_released_acceptance_is_sent_once_at_release(autojump_clock: trio.testing.MockClock) -> None:
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        held.hold("a", lambda: sent.append("a"))
        await trio.sleep(0)
        assert sent == []
        held.release("a")
        held.release("a")
        assert sent == ["a"]
        await trio.sleep(held_accepts.HOLD_SECONDS * 2)
        assert sent == ["a"]  # not again when it would have been due
        nursery.cancel_scope.cancel()


async def test_an_acceptance_held_too_long_goes_alone_in_order(autojump_clock: trio.testing.MockClock) -> None:
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        held.hold("first", lambda: sent.append("first"))
        await trio.sleep(held_accepts.HOLD_SECONDS / 2)
        held.hold("second", lambda: sent.append("second"))
        await trio.sleep(held_accepts.HOLD_SECONDS * 0.75)
        assert sent == ["first"]  # the first is due, the second not yet
        await trio.sleep(held_accepts.HOLD_SECONDS)
        assert sent == ["first", "second"]
        held.release("second")
        assert sent == ["first", "second"]
        nursery.cancel_scope.cancel()
