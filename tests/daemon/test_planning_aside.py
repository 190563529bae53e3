"""Plans run on a thread (costly ones, and those whose lookups may wait for a disk): one
per uid at a time, bounded per uid; the users whose disks hang never hold the threads
another user's costly plan needs."""

from __future__ import annotations

import functools
import threading
import time

import trio

from toold_daemon.sandbox.lookups import WouldBlock, must_not_wait
from toold_daemon.service.planning_aside import THREADS, WAITING_PER_UID, PlanningAside


async def test_one_uids_plans_run_one_at_a_time_and_another_uid_need_not_wait() -> None:
    aside = PlanningAside()
    running: dict[int, int] = {1000: 0, 1001: 0}
    most: dict[int, int] = {1000: 0, 1001: 0}
    finished: list[tuple[int, float]] = []
    lock = threading.Lock()
    loop_thread = threading.get_ident()

    def plan(uid: int) -> int:
        assert threading.get_ident() != loop_thread  # off the event loop's thread
        with lock:
            running[uid] += 1
            most[uid] = max(most[uid], running[uid])
        time.sleep(0.05)
        with lock:
            running[uid] -= 1
        return uid

    async def submit(uid: int) -> None:
        assert await aside.plan(uid, lambda: plan(uid), costly=True) == uid
        finished.append((uid, trio.current_time()))

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(submit, 1000)
        await trio.sleep(0.01)
        assert aside.waiting(1000) == 4 and aside.admits(1000)
        nursery.start_soon(submit, 1001)
    assert most == {1000: 1, 1001: 1}
    other = next(at for uid, at in finished if uid == 1001)
    assert other - started < 0.15  # beside the first uid's plans, not after all four of them
    assert aside.waiting(1000) == 0 and aside._turns == {}  # nothing kept for idle uids


async def test_past_its_bound_a_uids_next_costly_plan_is_not_admitted() -> None:
    aside = PlanningAside()
    release = threading.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(WAITING_PER_UID):
            nursery.start_soon(functools.partial(aside.plan, 7, release.wait, costly=True))
        await trio.sleep(0.01)
        assert not aside.admits(7) and aside.admits(8)
        release.set()
    assert aside.admits(7)


def _a_disk_that_hangs(released: threading.Event, attempts: list[bool]) -> bool:
    """A plan whose lookup waits for a disk until ``released``; where a lookup may not
    wait it says so, as ``sandbox.lookups`` does for a path the kernel has not cached."""
    attempts.append(must_not_wait())
    if must_not_wait():
        raise WouldBlock()
    released.wait()
    return True


async def _a_costly_plan_finishes_soon(aside: PlanningAside) -> float:
    started = trio.current_time()
    assert await aside.plan(9999, lambda: sum(range(1000)), costly=True) == sum(range(1000))
    return trio.current_time() - started


async def test_users_whose_disks_hang_never_hold_the_threads_of_another_users_costly_plan() -> None:
    """More users than there are computing threads each have a plan waiting on a disk
    that hangs: sent aside from the loop, or costly and found waiting on its thread.
    Another user's costly plan still runs at once, and once the disks answer every
    plan finishes."""
    aside = PlanningAside()
    released = threading.Event()
    attempts: dict[int, list[bool]] = {uid: [] for uid in range(2000, 2000 + 2 * THREADS + 2)}
    answers: list[bool] = []

    async def waits(uid: int, costly: bool) -> None:
        answers.append(await aside.plan(uid, lambda: _a_disk_that_hangs(released, attempts[uid]), costly=costly))

    try:
        async with trio.open_nursery() as nursery:
            for n, uid in enumerate(attempts):
                nursery.start_soon(waits, uid, n % 2 == 0)
            await trio.sleep(0.3)
            assert all(attempts.values()), "every plan has begun"
            with trio.fail_after(2):
                took = await _a_costly_plan_finishes_soon(aside)
            assert took < 0.5, took
            assert not answers  # the disks still hang
            released.set()
    finally:
        released.set()
    assert answers == [True] * len(attempts)
    for n, tried in enumerate(attempts.values()):
        # A costly plan tried from the caches alone first, then where it may wait.
        assert tried == ([True, False] if n % 2 == 0 else [False]), (n, tried)
