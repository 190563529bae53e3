"""The daemon's socket with clients that stop reading: libzmq is handed only a few
megabytes for such a client (its own bound counts frames, 64 of any size), the rest waits
in the outbox where it is counted, and one uid's connections share one bound.

A real ROUTER (``IpcServer``) served in the test's trio loop; real DEALER clients on
the same ipc socket, reading only when the test says so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import zmq

from toold_daemon.service.ipc import IN_FLIGHT_BYTES, Inbound, IpcServer

pytestmark = pytest.mark.trio

MB = 1 << 20


@asynccontextmanager
async def serving(tmp_path: Path, **bounds: int) -> AsyncIterator[tuple[IpcServer, list[Inbound], str]]:
    endpoint = f"ipc://{tmp_path}/s.sock"
    server = IpcServer(endpoint, hard_max_frame_bytes=64 * MB, **bounds)
    server.claim()
    server.bind()
    heard: list[Inbound] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, heard.append)
            yield server, heard, endpoint
            nursery.cancel_scope.cancel()
    finally:
        server.close()


def stalled_client(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """A client that takes one frame into its own queue and then reads nothing."""
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    client.rcvhwm = 1
    client.setsockopt(zmq.RCVBUF, 4096)
    client.connect(endpoint)
    return client


async def peer_of(client: zmq.Socket[bytes], heard: list[Inbound]) -> bytes:
    """The routing id the server knows ``client`` by (it says hello first)."""
    known = {inbound.peer for inbound in heard}
    client.send(b"hello")
    with trio.fail_after(5):
        while True:
            new = [inbound.peer for inbound in heard if inbound.peer not in known]
            if new:
                return new[0]
            await trio.sleep(0.005)


async def read_all(client: zmq.Socket[bytes], count: int) -> list[bytes]:
    frames: list[bytes] = []
    with trio.fail_after(20):
        while len(frames) < count:
            try:
                frames.append(client.recv(zmq.NOBLOCK))
            except zmq.Again:
                await trio.sleep(0.002)
    return frames


async def test_a_client_that_stops_reading_is_handed_only_a_few_megabytes(tmp_path: Path) -> None:
    """Twelve 1 MB frames for a client that reads nothing: libzmq would take all of them
    (64 frames per peer); it is handed about IN_FLIGHT_BYTES, the rest wait in the outbox.
    Once the client reads, every frame arrives, in order."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with serving(tmp_path, max_backlog_bytes=64 * MB) as (server, heard, endpoint):
            client = stalled_client(ctx, endpoint)
            peer = await peer_of(client, heard)
            frames = [bytes([n]) * MB for n in range(12)]
            for frame in frames:
                server.send(peer, frame)
            await trio.sleep(0.3)  # libzmq has written what the kernel takes
            waiting = server.pending()
            handed = len(frames) - waiting
            assert IN_FLIGHT_BYTES <= 4 * MB
            assert handed <= 5, f"{handed} frames handed to libzmq for a client not reading"
            received = await read_all(client, len(frames))
            assert received == frames
            assert server.pending() == 0
    finally:
        ctx.destroy(linger=0)


async def test_a_uids_connections_share_one_bound(tmp_path: Path) -> None:
    """Three connections of one uid that never read, each under its own bound: the one
    whose frame would take the uid past ``max_uid_backlog_bytes`` is cut off, told why,
    and what it was handed stays counted."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        bounds = {"max_backlog_bytes": 16 * MB, "max_uid_backlog_bytes": 20 * MB}
        async with serving(tmp_path, **bounds) as (server, heard, endpoint):
            clients = [stalled_client(ctx, endpoint) for _ in range(3)]
            peers = [await peer_of(client, heard) for client in clients]
            for peer in peers:
                for _ in range(8):
                    server.send(peer, b"x" * MB)
                    await trio.sleep(0.01)
            cut_off = [inbound for inbound in heard if inbound.frame is None]
            assert [inbound.peer for inbound in cut_off] == [peers[2]]
            assert "this user's clients" in cut_off[0].overflowed
            # the first two hold 16 MB; the third was handed 4 before the bound
            assert server.pending() == 2 * (8 - IN_FLIGHT_BYTES // MB)
            # once the clients are gone (noticed within PEER_CHECK_SECONDS), nothing of
            # theirs is counted, the cut-off one's included
            for client in clients:
                client.close()
            # nor remembered as cut off: clients cycling through cut-offs would grow that set.
            # (What was handed to a closed connection may stop counting before the watcher
            # notices it gone: both are waited for.)
            with trio.fail_after(5):
                while server.waiting_bytes_by_uid() or server._overflowed:
                    await trio.sleep(0.05)
            assert server.pending() == 0
    finally:
        ctx.destroy(linger=0)
