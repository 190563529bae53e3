"""The clients' door looked at from outside the pump (``IpcServer.ringing``, asked by a
batch's task before it holds the loop a moment). Asking libzmq for its events takes the
edge of the descriptor the sleeping pump waits on: a frame seen so must still be served
at once, not when something else next wakes the pump.

A real ROUTER served in the test's trio loop and a real DEALER client on its ipc socket."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import zmq

from tests.daemon.test_ipc_backlog import peer_of, serving

pytestmark = pytest.mark.trio


async def test_a_frame_seen_at_the_door_by_another_task_is_served_at_once(tmp_path: Path) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        async with serving(tmp_path) as (server, heard, endpoint):
            client = ctx.socket(zmq.DEALER)
            client.linger = 0
            client.connect(endpoint)
            await peer_of(client, heard)
            await trio.sleep(0.05)  # the pump sleeps on libzmq's descriptor
            served = len(heard)
            client.send(b"next")
            time.sleep(0.05)  # this task holds the loop while the frame arrives, unread
            assert server.ringing()  # seen from here: libzmq's edge is taken
            started = time.monotonic()
            with trio.move_on_after(2):
                while len(heard) == served:
                    await trio.sleep(0.001)
            waited = time.monotonic() - started
            assert len(heard) > served and heard[-1].frame == b"next", "the frame seen was never served"
            assert waited < 0.5, f"served after {waited:.3f} s"
    finally:
        ctx.destroy(linger=0)
