"""A begun call's outcome taken on the loop's thread (``Workers.outcome_now``): a short
wait asleep in ``poll`` that a client's frame ends, and that leaves whatever it cannot
finish to ``Workers.run``.

The worker is played by the test over the real socket pair the pool makes, speaking
the real frames; its pid is a real process, which the pool kills when it ends a worker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import trio
import trio.testing

from toold_daemon.isolation import workers as workers_module
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.isolation.wire import Chunk, Outcome, SpawnRequest, frame, read_frame
from toold_daemon.isolation.worker import STALE
from toold_daemon.isolation.workers import Workers

REQUEST = SpawnRequest(call_id="c1", token="t", tool="read_file", uid=os.getuid(), gid=os.getgid(), roots=["/"])
CONFIG = b"config"


class StandIn:
    """The worker's side: its socket end and a process for its pid."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.process = subprocess.Popen(["sleep", "60"])

    async def start(self, request: SpawnRequest, fd: int) -> int:
        self.sock = socket.socket(fileno=os.dup(fd))
        self.sock.sendall(frame(Outcome(ok=True, data={"roots": ["/"]})))  # ready
        return self.process.pid

    def request(self) -> SpawnRequest:
        assert self.sock is not None
        body = read_frame(self.sock.fileno())
        assert body is not None
        return msgspec.msgpack.decode(body, type=SpawnRequest)

    def say(self, *messages: Chunk | Outcome) -> None:
        assert self.sock is not None
        for message in messages:
            self.sock.sendall(frame(message))

    def say_later(self, *messages: Chunk | Outcome) -> None:
        """In 0.1 s, from a thread (the test's loop thread is asleep in the wait by then)."""

        def later() -> None:
            time.sleep(0.1)
            self.say(*messages)

        threading.Thread(target=later, daemon=True).start()

    def ended(self) -> bool:
        return self.process.poll() is not None or _wait_exit(self.process)


def _wait_exit(process: subprocess.Popen[bytes]) -> bool:
    try:
        process.wait(timeout=2)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    worker = StandIn()
    yield worker
    worker.process.kill()
    worker.process.wait()


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait long enough to tell its ends apart (it is a millisecond in the daemon)."""
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 3000)


async def begun_call(stand_in: StandIn) -> tuple[Workers, workers_module.Begun]:
    pool = Workers(stand_in.start, Cgroups(), pids_max=0, memory_max=0, max_workers=4, idle_seconds=60)
    await pool.ensure(REQUEST, CONFIG)
    begun = pool.begin(REQUEST, CONFIG)
    assert begun is not None and not begun.unsent
    assert stand_in.request().call_id == "c1"
    return pool, begun


@pytest.fixture
def door() -> Iterator[tuple[int, int]]:
    """The clients' door, as a pipe: (its read end, the end a client rings)."""
    read_end, write_end = os.pipe()
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


async def test_an_outcome_already_there_is_taken_and_its_worker_goes_back_to_the_pool(stand_in: StandIn) -> None:
    pool, begun = await begun_call(stand_in)
    stand_in.say(Outcome(ok=True, content="hello"))
    outcome = pool.outcome_now(begun, None)
    assert outcome is not None and outcome.content == "hello"
    assert pool.begin(REQUEST, CONFIG) is not None, "the same worker is idle again, and takes the next call"


async def test_without_a_door_nothing_is_waited_for(stand_in: StandIn, long_wait: None) -> None:
    pool, begun = await begun_call(stand_in)
    started = time.monotonic()
    assert pool.outcome_now(begun, None) is None
    assert time.monotonic() - started < 0.5
    stand_in.say(Outcome(ok=True, content="late"))
    outcome = await pool.run(REQUEST, CONFIG, lambda chunk: None, begun=begun)
    assert outcome.content == "late", "the call is finished the usual way"


async def test_an_outcome_that_comes_during_the_wait_is_taken(
    stand_in: StandIn, long_wait: None, door: tuple[int, int]
) -> None:
    pool, begun = await begun_call(stand_in)
    stand_in.say_later(Outcome(ok=True, content="whole"))
    started = time.monotonic()
    outcome = pool.outcome_now(begun, door[0])
    assert outcome is not None and outcome.content == "whole"
    assert time.monotonic() - started < 2.0


async def test_a_call_that_streams_is_left_to_run_with_its_output_in_order(
    stand_in: StandIn, long_wait: None, door: tuple[int, int]
) -> None:
    """Its chunks are events that must follow the call's start: ``run`` passes them on."""
    pool, begun = await begun_call(stand_in)
    stand_in.say(Chunk(stream="stdout", data="part"), Outcome(ok=True, content="whole"))
    time.sleep(0.1)
    started = time.monotonic()
    assert pool.outcome_now(begun, door[0]) is None
    assert time.monotonic() - started < 0.5, "not waited for: the chunk was there"
    chunks: list[Chunk] = []
    outcome = await pool.run(REQUEST, CONFIG, chunks.append, begun=begun)
    assert outcome.content == "whole" and chunks == [Chunk(stream="stdout", data="part")]


async def test_an_outcome_in_pieces_is_read_whole(stand_in: StandIn, long_wait: None, door: tuple[int, int]) -> None:
    pool, begun = await begun_call(stand_in)
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
    stand_in: StandIn, long_wait: None, door: tuple[int, int]
) -> None:
    pool, begun = await begun_call(stand_in)

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
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch, door: tuple[int, int]
) -> None:
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 200)
    pool, begun = await begun_call(stand_in)
    started = time.monotonic()
    assert pool.outcome_now(begun, door[0]) is None
    assert 0.15 < time.monotonic() - started < 2.0


async def test_no_wait_while_another_call_waits_for_its_worker(
    stand_in: StandIn, long_wait: None, door: tuple[int, int]
) -> None:
    """Its outcome would wait for the loop meanwhile: only the call alone in the workers waits."""
    pool, begun = await begun_call(stand_in)
    other = StandIn()
    try:
        other_pool_request = msgspec.structs.replace(REQUEST, roots=["/tmp"], call_id="c2")
        pool._start_child = other.start  # (the second worker is played by another stand-in)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, other_pool_request, CONFIG, lambda chunk: None)
            await trio.testing.wait_all_tasks_blocked()
            started = time.monotonic()
            assert pool.outcome_now(begun, door[0]) is None
            assert time.monotonic() - started < 0.5
            other.request()
            other.say(Outcome(ok=True))
    finally:
        other.process.kill()
        other.process.wait()


async def test_a_stale_worker_is_ended_and_the_call_left_to_run_afresh(stand_in: StandIn) -> None:
    pool, begun = await begun_call(stand_in)
    stand_in.say(Outcome(ok=False, error_code=STALE))
    outcome = pool.outcome_now(begun, None)
    assert outcome is not None and outcome.error_code == STALE
    assert stand_in.ended(), "the worker whose workspace was made anew is ended"


async def test_a_worker_that_vanished_is_left_for_run_to_report(stand_in: StandIn, door: tuple[int, int]) -> None:
    pool, begun = await begun_call(stand_in)
    assert stand_in.sock is not None
    stand_in.sock.close()
    assert pool.outcome_now(begun, door[0]) is None
    with pytest.raises(workers_module.WorkerFailed):
        await pool.run(REQUEST, CONFIG, lambda chunk: None, begun=begun)


async def test_a_worker_that_streams_on_and_on_does_not_hold_the_loop(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch, door: tuple[int, int]
) -> None:
    """The worker runs as the client, who can make it say anything: chunks as fast as
    they can be read end the wait at the first (``run`` reads them, yielding between)."""
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 100)
    pool, begun = await begun_call(stand_in)
    assert stand_in.sock is not None
    chunk = bytes(frame(Chunk(stream="stdout", data="y" * 100))) * 100
    flood = subprocess.Popen(  # another process: it outpaces the reader, as a worker would
        [sys.executable, "-c", f"import os\nwhile True: os.write({stand_in.sock.fileno()}, {chunk!r})"],
        pass_fds=[stand_in.sock.fileno()],
    )
    try:
        time.sleep(0.2)  # the socket's buffer is full
        for interrupt_fd in (door[0], None):
            started = time.monotonic()
            assert pool.outcome_now(begun, interrupt_fd) is None
            assert time.monotonic() - started < 0.3, "the wait ends at once, not with the flood"
    finally:
        flood.kill()
        flood.wait()
