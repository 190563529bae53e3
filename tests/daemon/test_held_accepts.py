"""``batch_accepted`` held for a quick batch: sent with the result, or alone once due
(on trio's mock clock, so the timings are exact)."""

from __future__ import annotations

import trio
import trio.testing

from toold_daemon.service import held_accepts
from toold_daemon.service.held_accepts import HeldAccepts, SendAcceptance
from toold_protocol import BatchFinished

OUTCOME = BatchFinished(batch_id="a", state="finished", results=[])


def recorder(sent: list[object], name: str, *, carries: bool = False) -> SendAcceptance:
    """A sender that notes what it sent: its name alone, or (name, outcome) when it carried it."""

    def send(outcome: BatchFinished | None) -> bool:
        carried = carries and outcome is not None
        sent.append((name, outcome) if carried else name)
        return carried

    return send


async def test_a_released_acceptance_is_sent_once_at_release(autojump_clock: trio.testing.MockClock) -> None:
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        held.hold("a", recorder(sent, "a"))
        await trio.sleep(0)
        assert sent == []
        assert held.release("a", OUTCOME) is False  # sent alone: the outcome still has to go
        assert held.release("a", OUTCOME) is False
        assert sent == ["a"]
        await trio.sleep(held_accepts.HOLD_SECONDS * 2)
        assert sent == ["a"]  # not again when it would have been due
        nursery.cancel_scope.cancel()


async def test_an_acceptance_released_with_the_outcome_may_carry_it(autojump_clock: trio.testing.MockClock) -> None:
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        held.hold("a", recorder(sent, "a", carries=True))
        assert held.release("a", OUTCOME) is True
        assert sent == [("a", OUTCOME)]
        assert held.release("a", OUTCOME) is False  # gone: nothing is sent twice
        await trio.sleep(held_accepts.HOLD_SECONDS * 2)
        assert sent == [("a", OUTCOME)]
        nursery.cancel_scope.cancel()


async def test_an_acceptance_held_too_long_goes_alone_in_order(autojump_clock: trio.testing.MockClock) -> None:
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        held.hold("first", recorder(sent, "first", carries=True))
        held.watch()
        await trio.sleep(held_accepts.HOLD_SECONDS / 2)
        held.hold("second", recorder(sent, "second", carries=True))
        held.watch()
        await trio.sleep(held_accepts.HOLD_SECONDS * 0.75)
        assert sent == ["first"]  # the first is due (alone, no outcome yet), the second not yet
        await trio.sleep(held_accepts.HOLD_SECONDS)
        assert sent == ["first", "second"]
        assert held.release("second", OUTCOME) is False  # already sent: the outcome goes on its own
        assert sent == ["first", "second"]
        nursery.cancel_scope.cancel()


async def test_a_held_acceptance_is_sent_when_due_once_it_is_watched(autojump_clock: trio.testing.MockClock) -> None:
    """A batch that ends within its handler releases its acceptance before anything is
    watched: nothing wakes the sending task for it. One still running is watched, and
    its acceptance goes out when due."""
    held, sent = HeldAccepts(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(held.send_when_due)
        await trio.testing.wait_all_tasks_blocked()  # the task waits for something held
        held.hold("quick", recorder(sent, "quick", carries=True))
        assert held.release("quick", OUTCOME) is True
        held.watch()  # nothing is held any more: the task is not woken
        held.hold("slow", recorder(sent, "slow", carries=True))
        await trio.sleep(held_accepts.HOLD_SECONDS * 2)
        assert sent == [("quick", OUTCOME)], "not watched yet: the task was never told"
        held.watch()
        await trio.sleep(held_accepts.HOLD_SECONDS * 2)
        assert sent == [("quick", OUTCOME), "slow"]
        nursery.cancel_scope.cancel()
