"""The protocol process's channel to the spawner stays in step whatever a client does.

Attacks: cancel a batch at the moment its worker is being started (the spawner's reply
cut in two), or make the single-threaded spawner slow (a workspace root on a mount that
hangs) so that every other user's spawns wait behind it. Neither may desynchronise the
channel or cut everyone off. The spawner is played by the test on the other end of a
real socket pair, so its replies can be delayed or split at will; the same attacks
against the real spawner are in test_h_robustness.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator

import msgspec
import pytest
import trio

from toold_daemon.errors import ToolError
from toold_daemon.isolation import spawner_link as link_module
from toold_daemon.isolation import sweep
from toold_daemon.isolation.sockets import receive_frame, receive_frame_with_fds
from toold_daemon.isolation.spawner_link import SpawnerLink
from toold_daemon.isolation.wire import Spawned, SpawnRequest, TempWanted, frame

Channel = tuple[SpawnerLink, trio.socket.SocketType]


@pytest.fixture
async def channel() -> AsyncIterator[Channel]:
    """The runner's link to a spawner that is the test, at the other end of a real socket pair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runner = SpawnerLink(os.getpid(), ours)
    spawner = trio.socket.from_stdlib_socket(theirs)
    yield runner, spawner
    runner.close()
    spawner.close()


async def _reply_in_two_parts(spawner: trio.socket.SocketType, reply: Spawned, pause: float) -> None:
    await receive_frame(spawner)
    data = frame(reply)
    await spawner.send(data[:4])
    await trio.sleep(pause)
    await spawner.send(data[4:])


async def _chore_answered(runner: SpawnerLink, spawner: trio.socket.SocketType, path: str) -> Spawned:
    """One temp-dir request that the spawner answers with ``path``: what the runner got."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reply_in_two_parts, spawner, Spawned(path=path), 0.0)
        with trio.fail_after(5):
            return await runner.chore(TempWanted(uid=1000, gid=1000))


async def test_an_asker_that_goes_on_once_its_request_is_written_still_gets_its_own_answer(channel: Channel) -> None:
    """The daemon's start goes on as soon as the probe's request is written (``sent``),
    and reads the child's pid later. A request made meanwhile waits its turn, so each
    asker gets the answer to its own request."""
    runner, spawner = channel
    read_end, write_end = os.pipe()
    pids: dict[str, int] = {}

    async def ask(token: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        request = SpawnRequest(uid=os.getuid(), gid=os.getgid(), call_id=token, token=token, tool="shell")
        pids[token] = await runner.ask(request, write_end, sent=task_status.started)

    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(ask, "first")  # back once the request is written
                assert pids == {}  # the spawner has not answered
                nursery.start_soon(ask, "second")
                for _ in range(2):
                    body, fds = await receive_frame_with_fds(spawner)
                    for fd in fds:
                        os.close(fd)
                    token = msgspec.msgpack.decode(body, type=SpawnRequest).token
                    await spawner.send(frame(Spawned(pid={"first": 101, "second": 202}[token])))
        assert pids == {"first": 101, "second": 202}
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_an_asker_whose_sent_callback_fails_leaves_its_answer_to_be_read_first(channel: Channel) -> None:
    """A ``sent`` callback that raises ends its exchange after the request went out: the
    spawner's answer to it is still owed, so the next asker reads past it to its own."""
    runner, spawner = channel
    read_end, write_end = os.pipe()

    def fails() -> None:
        raise RuntimeError("the asker's own failure")

    try:
        request = SpawnRequest(uid=os.getuid(), gid=os.getgid(), call_id="c", token="", tool="shell")
        with pytest.raises(RuntimeError), trio.fail_after(5):
            await runner.ask(request, write_end, sent=fails)
        _, fds = await receive_frame_with_fds(spawner)
        for fd in fds:
            os.close(fd)
        await spawner.send(frame(Spawned(pid=101)))  # the first request's answer, come late
        assert (await _chore_answered(runner, spawner, "/second")).path == "/second"
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_caller_cancelled_mid_reply_does_not_hand_the_next_caller_its_answer(channel: Channel) -> None:
    runner, spawner = channel
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reply_in_two_parts, spawner, Spawned(path="/first"), 0.2)
        with trio.move_on_after(0.05):
            await runner.chore(TempWanted(uid=1000, gid=1000))
    assert (await _chore_answered(runner, spawner, "/second")).path == "/second"


async def test_a_late_spawner_costs_one_caller_and_the_next_still_gets_its_own_reply(
    channel: Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the wait, a caller is told the spawner is slow; its reply, when it comes, is
    read by the next exchange, so that caller gets its own answer, not the late one."""
    runner, spawner = channel
    monkeypatch.setattr(link_module, "SPAWNER_SILENT_SECONDS", 0.2)
    with trio.fail_after(5):
        first = await runner.chore(TempWanted(uid=1000, gid=1000))
    assert "did not answer within" in first.error
    await receive_frame(spawner)  # the spawner gets to the first request at last
    await spawner.send(frame(Spawned(path="/late")))
    assert (await _chore_answered(runner, spawner, "/second")).path == "/second"


async def test_a_command_started_for_a_caller_that_gave_up_is_swept(
    channel: Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The late reply says a command started: nobody waits for it, so the next exchange
    kills it (found by its call token, below the spawner: here, below this process)."""
    runner, spawner = channel
    monkeypatch.setattr(link_module, "SPAWNER_SILENT_SECONDS", 0.2)
    token = "late-call-token"
    request = SpawnRequest(uid=os.getuid(), gid=os.getgid(), call_id="c", token=token, tool="shell")
    read_end, write_end = os.pipe()
    with pytest.raises(ToolError) as slow:
        with trio.fail_after(5):
            await runner.ask(request, write_end)
    assert slow.value.code == "SPAWNER_SLOW"
    orphan = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "TOOLD_CALL": token})
    try:
        while sweep._token_of(orphan.pid) != token:  # until the kernel shows its new environment
            await trio.sleep(0.01)
        await receive_frame(spawner)
        await spawner.send(frame(Spawned(pid=orphan.pid)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_reply_in_two_parts, spawner, Spawned(path="/next"), 0.0)
            with trio.fail_after(5):
                assert (await runner.chore(TempWanted(uid=1000, gid=1000))).path == "/next"
        assert orphan.wait(timeout=5) == -signal.SIGKILL
    finally:
        orphan.kill()
        os.close(read_end)
        os.close(write_end)


async def test_garbage_from_the_spawner_ends_its_channel(channel: Channel) -> None:
    runner, spawner = channel
    async with trio.open_nursery() as nursery:

        async def answer_garbage() -> None:
            await receive_frame(spawner)
            await spawner.send((0xFFFFFFF0).to_bytes(4, "big"))  # a length over any limit

        nursery.start_soon(answer_garbage)
        with trio.fail_after(5):
            reply = await runner.chore(TempWanted(uid=1000, gid=1000))
    assert "exited" in reply.error
    with trio.fail_after(5):
        assert "exited" in (await runner.chore(TempWanted(uid=1000, gid=1000))).error  # at once, not out of step
