"""A begun call's outcome taken on the loop's thread (``Workers.outcome_now``): a short
wait asleep in ``poll`` that a client's frame ends, and that leaves whatever it cannot
finish to ``Workers.run``.

The workers are played by the test (``tests.worker_stand_ins``). A worker that floods
the wait is attacked in ``tests/security/test_q_a_chattering_worker_cannot_hold_the_loop.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import trio
import trio.testing

from tests.worker_stand_ins import StandIn, StandIns
from toold_daemon.isolation import workers as workers_module
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.isolation.wire import Chunk, Outcome, SpawnRequest, frame
from toold_daemon.isolation.worker import STALE
from toold_daemon.isolation.workers import Workers

REQUEST = SpawnRequest(call_id="c1", token="t", tool="read_file", uid=os.getuid(), gid=os.getgid(), roots=["/"])
CONFIG = b"config"


@pytest.fixture
def stand_ins() -> Iterator[StandIns]:
    workers = StandIns()
    yield workers
    workers.close()


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait long enough to tell its ends apart (it is a millisecond in the daemon)."""
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 3000)


async def begun_call(stand_ins: StandIns) -> tuple[Workers, workers_module.Begun, StandIn]:
    """A pool with one worker, and a call begun in it: the worker has its request."""
    pool = Workers(stand_ins.start, Cgroups(), pids_max=0, memory_max=0, max_workers=4, idle_seconds=60)
    await pool.ensure(REQUEST, CONFIG)
    begun = pool.begin(REQUEST, CONFIG)
    assert begun is not None and not begun.unsent
    stand_in = stand_ins.started[0]
    assert stand_in.request().call_id == "c1"
    return pool, begun, stand_in


@pytest.fixture
def door() -> Iterator[tuple[int, int]]:
    """The clients' door, as a pipe: (its read end, the end a client rings)."""
    read_end, write_end = os.pipe()
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


async def test_an_outcome_already_there_is_taken_and_its_worker_goes_back_to_the_pool(stand_ins: StandIns) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    stand_in.say(Outcome(ok=True, content="hello"))
    outcome = pool.outcome_now(begun, None)
    assert outcome is not None and outcome.content == "hello"
    assert pool.begin(REQUEST, CONFIG) is not None, "the same worker is idle again, and takes the next call"


async def test_without_a_door_nothing_is_waited_for(stand_ins: StandIns, long_wait: None) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    started = time.monotonic()
    assert pool.outcome_now(begun, None) is None
    assert time.monotonic() - started < 0.5
    stand_in.say(Outcome(ok=True, content="late"))
    outcome = await pool.run(REQUEST, CONFIG, lambda chunk: None, begun=begun)
    assert outcome.content == "late", "the call is finished the usual way"


async def test_an_outcome_that_comes_during_the_wait_is_taken(
    stand_ins: StandIns, long_wait: None, door: tuple[int, int]
) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    stand_in.say_later(Outcome(ok=True, content="whole"))
    started = time.monotonic()
    outcome = pool.outcome_now(begun, door[0])
    assert outcome is not None and outcome.content == "whole"
    assert time.monotonic() - started < 2.0


async def test_a_call_that_streams_is_left_to_run_with_its_output_in_order(
    stand_ins: StandIns, long_wait: None, door: tuple[int, int]
) -> None:
    """Its chunks are events that must follow the call's start: ``run`` passes them on."""
    pool, begun, stand_in = await begun_call(stand_ins)
    stand_in.say(Chunk(stream="stdout", data="part"), Outcome(ok=True, content="whole"))
    time.sleep(0.1)
    started = time.monotonic()
    assert pool.outcome_now(begun, door[0]) is None
    assert time.monotonic() - started < 0.5, "not waited for: the chunk was there"
    chunks: list[Chunk] = []
    outcome = await pool.run(REQUEST, CONFIG, chunks.append, begun=begun)
    assert outcome.content == "whole" and chunks == [Chunk(stream="stdout", data="part")]


async def test_an_outcome_in_pieces_is_read_whole(stand_ins: StandIns, long_wait: None, door: tuple[int, int]) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    whole = bytes(frame(Outcome(ok=True, content="x" * 300_000)))
    assert stand_in.sock is not None
    stand_in.sock.sendall(whole[:1000])

    def rest() -> None:
        time.sleep(0.1)
        assert stand_in.sock is not None
        stand_in.sock.sendall(whole[1000:])

    threading.Thread(target=rest, daemon=True).start()
    outcome = pool.outcome_now(begun, door[0])
    assert outcome is not None and len(outcome.content) == 300_000


async def test_a_client_at_the_door_ends_the_wait_and_the_call_is_finished_later(
    stand_ins: StandIns, long_wait: None, door: tuple[int, int]
) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)

    def ring() -> None:
        time.sleep(0.1)
        os.write(door[1], b"x")

    threading.Thread(target=ring, daemon=True).start()
    started = time.monotonic()
    assert pool.outcome_now(begun, door[0]) is None
    assert 0.05 < time.monotonic() - started < 2.0, "the wait ended when the client came, not at its end"
    stand_in.say(Outcome(ok=True, content="served after"))
    outcome = await pool.run(REQUEST, CONFIG, lambda chunk: None, begun=begun)
    assert outcome.content == "served after"


async def test_the_wait_ends_at_its_bound(
    stand_ins: StandIns, monkeypatch: pytest.MonkeyPatch, door: tuple[int, int]
) -> None:
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 200)
    pool, begun, _ = await begun_call(stand_ins)
    started = time.monotonic()
    assert pool.outcome_now(begun, door[0]) is None
    assert 0.15 < time.monotonic() - started < 2.0


async def test_no_wait_while_another_call_waits_for_its_worker(
    stand_ins: StandIns, long_wait: None, door: tuple[int, int]
) -> None:
    """Its outcome would wait for the loop meanwhile: only the call alone in the workers waits."""
    pool, begun, _ = await begun_call(stand_ins)
    other_request = msgspec.structs.replace(REQUEST, roots=["/tmp"], call_id="c2")  # another kind: a second worker
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run, other_request, CONFIG, lambda chunk: None)
        await trio.testing.wait_all_tasks_blocked()
        started = time.monotonic()
        assert pool.outcome_now(begun, door[0]) is None
        assert time.monotonic() - started < 0.5
        other = stand_ins.started[1]
        assert other.request().call_id == "c2"
        other.say(Outcome(ok=True))


async def test_a_stale_worker_is_ended_and_the_call_left_to_run_afresh(stand_ins: StandIns) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    stand_in.say(Outcome(ok=False, error_code=STALE))
    outcome = pool.outcome_now(begun, None)
    assert outcome is not None and outcome.error_code == STALE
    assert stand_in.ended(), "the worker whose workspace was made anew is ended"


async def test_a_worker_that_vanished_is_left_for_run_to_report(stand_ins: StandIns, door: tuple[int, int]) -> None:
    pool, begun, stand_in = await begun_call(stand_ins)
    stand_in.sock.close()
    assert pool.outcome_now(begun, door[0]) is None
    with pytest.raises(workers_module.WorkerFailed):
        await pool.run(REQUEST, CONFIG, lambda chunk: None, begun=begun)
