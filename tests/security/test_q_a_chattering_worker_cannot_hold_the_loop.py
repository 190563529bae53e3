"""A tool worker runs as the client, so the client can make it say anything on its
socket. One that streams output without end, faster than the daemon reads it, must not
hold the event loop: every message the daemon takes from a worker, and every piece of a
large one, leaves the other tasks (everyone else's calls) a turn. Real socket pairs,
real frames, a real trio loop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import trio

from tests.worker_stand_ins import Bystander, StandIn, StandIns
from toold_daemon.isolation import workers as workers_module
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.isolation.wire import Chunk, Outcome, SpawnRequest, frame
from toold_daemon.isolation.workers import Worker, Workers

REQUEST = SpawnRequest(call_id="c1", token="t", tool="read_file", uid=os.getuid(), gid=os.getgid(), roots=["/"])


def _worker() -> tuple[Worker, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    kind = (1000, 1000, ("/r",), 0, ())
    return Worker(pid=0, sock=trio.socket.from_stdlib_socket(ours), kind=kind, cgroup=""), theirs


async def test_a_stream_of_chunks_already_read_leaves_other_tasks_their_turns() -> None:
    worker, theirs = _worker()
    try:
        chunks = 2_000
        for _ in range(chunks):  # all read into the daemon's buffer at once: no read ever waits
            worker.buffer.add(bytes(frame(Chunk(stream="stdout", data="x"))))
        worker.buffer.add(bytes(frame(Outcome(ok=True))))
        bystander = Bystander()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bystander.run)
            await trio.lowlevel.checkpoint()  # the bystander is running
            taken = 0
            while not isinstance(await worker.receive(), Outcome):
                taken += 1
            nursery.cancel_scope.cancel()
        assert taken == chunks
        turns = bystander.turns
        assert turns >= chunks // 2, f"the bystander ran {turns} times while {chunks} chunks were taken"
    finally:
        theirs.close()
        worker.sock.close()


async def test_a_large_outcome_in_pieces_leaves_other_tasks_their_turns() -> None:
    worker, theirs = _worker()
    try:
        body = bytes(frame(Outcome(ok=True, content="y" * (8 << 20))))
        bystander = Bystander()

        async def peer() -> None:
            await trio.to_thread.run_sync(theirs.sendall, body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(bystander.run)
            nursery.start_soon(peer)
            message = await worker.receive()
            nursery.cancel_scope.cancel()
        assert isinstance(message, Outcome) and len(message.content) == 8 << 20
        assert bystander.turns >= 10, f"the bystander ran {bystander.turns} times while 8 MiB were read"
    finally:
        theirs.close()
        worker.sock.close()


async def test_a_flood_of_chunks_ends_the_wait_for_a_begun_reads_outcome_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone read's outcome is waited for on the loop's thread, outside the loop
    (``Workers.outcome_now``): chunks as fast as they can be read end that wait at the
    first, with or without the clients' door, and ``run`` reads them as above."""
    monkeypatch.setattr(workers_module, "OUTCOME_WAIT_MS", 100)
    stand_ins = StandIns()
    pool = Workers(stand_ins.start, Cgroups(), pids_max=0, memory_max=0, max_workers=4, idle_seconds=60)
    await pool.ensure(REQUEST, b"config")
    begun = pool.begin(REQUEST, b"config")
    assert begun is not None
    stand_in = stand_ins.started[0]
    stand_in.request()
    door, ring = os.pipe()
    chunk = bytes(frame(Chunk(stream="stdout", data="y" * 100))) * 100
    flood = subprocess.Popen(  # another process: it outpaces the reader, as a worker would
        [sys.executable, "-c", f"import os\nwhile True: os.write({stand_in.sock.fileno()}, {chunk!r})"],
        pass_fds=[stand_in.sock.fileno()],
    )
    try:
        time.sleep(0.2)  # the socket's buffer is full
        for interrupt_fd in (door, None):
            started = time.monotonic()
            assert pool.outcome_now(begun, interrupt_fd) is None
            assert time.monotonic() - started < 0.3, "the wait ends at once, not with the flood"
    finally:
        flood.kill()
        flood.wait()
        stand_ins.close()
        os.close(door)
        os.close(ring)


async def test_a_worker_that_says_more_than_its_outcome_answers_no_later_call() -> None:
    """Bytes past an outcome, read with it, would be taken as the next call's outcome (a
    forged answer before the question): such a worker ends, and the next call gets a
    fresh one, whichever way its outcome was read (at once, or by the call's task)."""
    stand_ins = StandIns()
    pool = Workers(stand_ins.start, Cgroups(), pids_max=0, memory_max=0, max_workers=4, idle_seconds=60)
    try:
        await pool.ensure(REQUEST, b"config")
        for way in ("at once", "by the task"):
            begun = pool.begin(REQUEST, b"config")
            assert begun is not None
            liar = stand_ins.started[-1]
            liar.request()
            liar.say(Outcome(ok=True, content="asked"), Outcome(ok=True, content="forged"))
            time.sleep(0.05)  # both in the socket: read together
            if way == "at once":
                outcome = pool.outcome_now(begun, None)
            else:
                outcome = await pool.run(REQUEST, b"config", lambda chunk: None, begun=begun)
            assert outcome is not None and outcome.content == "asked"
            assert liar.ended(), f"{way}: the worker that said more was ended"
            await pool.ensure(REQUEST, b"config")  # a fresh one
            assert stand_ins.started[-1] is not liar
            honest = stand_ins.started[-1]

            async def answer(worker: StandIn = honest) -> None:
                await trio.to_thread.run_sync(worker.request)
                worker.say(Outcome(ok=True, content="true"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                outcome = await pool.run(REQUEST, b"config", lambda chunk: None)
            assert outcome.content == "true", "the next call got its own answer"
    finally:
        stand_ins.close()
