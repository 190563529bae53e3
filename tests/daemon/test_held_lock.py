"""``held``: a free lock is taken without a trip through trio's scheduler (trio's own
``acquire`` always makes one, about 50 µs a time on a command's path); a taken one is
waited for, and it is released whatever the block raises."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from toold_daemon.isolation.zygotes import held


async def test_a_free_lock_is_taken_without_a_checkpoint() -> None:
    lock = trio.Lock()
    with trio.testing.assert_no_checkpoints():
        async with held(lock):
            assert lock.locked()
    assert not lock.locked()
    with trio.testing.assert_checkpoints():  # trio's own passes through the scheduler
        async with lock:
            pass


async def test_a_taken_lock_is_waited_for_and_released_on_an_error() -> None:
    lock, order = trio.Lock(), list[str]()

    async def second() -> None:
        async with held(lock):
            order.append("second")

    async with trio.open_nursery() as nursery, held(lock):
        nursery.start_soon(second)
        await trio.sleep(0.01)  # the second task waits meanwhile
        order.append("first")
    assert order == ["first", "second"] and not lock.locked()
    with pytest.raises(KeyError):
        async with held(lock):
            raise KeyError
    assert not lock.locked()
