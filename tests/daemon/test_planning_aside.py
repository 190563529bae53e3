"""Plans costly enough to run on a thread: one per uid at a time, bounded per uid."""

from __future__ import annotations

import threading
import time

import trio

from toold_daemon.service.planning_aside import WAITING_PER_UID, PlanningAside


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
        assert await aside.plan(uid, lambda: plan(uid)) == uid
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
            nursery.start_soon(aside.plan, 7, release.wait)
        await trio.sleep(0.01)
        assert not aside.admits(7) and aside.admits(8)
        release.set()
    assert aside.admits(7)
