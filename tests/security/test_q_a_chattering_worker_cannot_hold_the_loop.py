"""A tool worker runs as the client, so the client can make it say anything on its
socket. One that streams output without end, faster than the daemon reads it, must not
hold the event loop: every message the daemon takes from a worker, and every piece of a
large one, leaves the other tasks (everyone else's calls) a turn. Real socket pairs,
real frames, a real trio loop."""

from __future__ import annotations

import socket

import trio

from toold_daemon.isolation.wire import Chunk, Outcome, frame
from toold_daemon.isolation.workers import Worker


class Bystander:
    """Another task on the loop, counting the turns it gets."""

    def __init__(self) -> None:
        self.turns = 0

    async def run(self) -> None:
        while True:
            self.turns += 1
            await trio.lowlevel.checkpoint()


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
