"""The protocol process's channel to the spawner stays in step whatever cancels a caller.

The spawner here is played by the test on the other end of a real socket pair, so that
the reply can be cut in two: its length first, its body after the caller was cancelled.
"""

from __future__ import annotations

import os
import socket

import pytest
import trio

from toold_daemon.config import Config
from toold_daemon.isolation import runner as runner_module
from toold_daemon.isolation.runner import SpawnRunner
from toold_daemon.isolation.sockets import receive_frame
from toold_daemon.isolation.wire import Spawned, TempWanted, frame


async def _reply_in_two_parts(spawner: trio.socket.SocketType, reply: Spawned, pause: float) -> None:
    await receive_frame(spawner)
    data = frame(reply)
    await spawner.send(data[:4])
    await trio.sleep(pause)
    await spawner.send(data[4:])


async def test_a_caller_cancelled_mid_reply_does_not_hand_the_next_caller_its_answer() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runner = SpawnRunner(os.getpid(), ours, Config())
    spawner = trio.socket.from_stdlib_socket(theirs)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reply_in_two_parts, spawner, Spawned(path="/first"), 0.2)
        with trio.move_on_after(0.05):
            await runner._chore(TempWanted(uid=1000, gid=1000))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reply_in_two_parts, spawner, Spawned(path="/second"), 0.0)
        with trio.fail_after(5):
            reply = await runner._chore(TempWanted(uid=1000, gid=1000))
    assert reply.path == "/second"
    runner.close()
    spawner.close()


async def test_a_silent_spawner_is_given_up_on_and_later_requests_fail_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runner = SpawnRunner(os.getpid(), ours, Config())
    monkeypatch.setattr(runner_module, "SPAWNER_SILENT_SECONDS", 0.1)
    with trio.fail_after(5):
        first = await runner._chore(TempWanted(uid=1000, gid=1000))
        second = await runner._chore(TempWanted(uid=1000, gid=1000))
    assert "exited" in first.error and "exited" in second.error
    runner.close()
    theirs.close()
