"""What a command never waits for: a zygote to start, when the last one wore out (its
successor is started beside it before), and its zygote's way out of the call's cgroup,
when the call has ended (tens of milliseconds each, now and then).

These tests are the protocol process: a real spawner, real zygotes, real commands."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

from toold_daemon.config.loading import parse
from toold_daemon.isolation import zygotes
from toold_daemon.isolation.runner import SpawnRunner
from toold_daemon.isolation.spawner import start
from toold_daemon.sandbox import build_sandbox
from toold_daemon.tools import ToolContext
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.shell import ShellArgs
from toold_protocol import Identity

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the spawner runs as root")

SPAWNS = 8  # a zygote's commands, here
AHEAD = 3  # its successor starts when this many are left
SLOW_MOVE_SECONDS = 1.0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def spawner() -> Iterator[tuple[int, socket.socket]]:
    """A real spawner, started as the daemon starts it: before the event loop runs (a
    fork from inside trio's loop would carry the loop's signal wake-up into it)."""
    spawner_pid, control = start(builtin_tools())
    try:
        yield spawner_pid, control
    finally:
        control.close()


class Commands:
    """``echo $PPID`` through a real runner: which zygote started each command."""

    def __init__(self, spawner: tuple[int, socket.socket], root: Path) -> None:
        self.config = parse('[tools.approval]\nallowlist = ["shell"]\n')
        self.shell = next(t for t in builtin_tools() if t.name == "shell")
        self.runner = SpawnRunner(spawner[0], spawner[1], self.config)
        self.sandbox = build_sandbox(self.config, [root])
        self.me = Identity(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())
        self.zygotes_of = psutil.Process(spawner[0])

    async def parent(self) -> int:
        ctx = ToolContext(call_id="c", sandbox=self.sandbox, config=self.config)
        output = await self.runner.run(self.shell, ShellArgs(command="echo $PPID"), ctx, self.me)
        return int(output.content.split()[0])

    async def until_two_zygotes(self) -> None:
        deadline = time.monotonic() + 20
        while self.runner.zygotes_alive < 2:
            assert time.monotonic() < deadline, "no successor started"
            await trio.sleep(0.01)

    async def hands_over(self, worn: int, served: list[int]) -> int:
        """The next command goes to a successor that was running before it was sent,
        and the worn zygote then exits."""
        running = {p.pid for p in self.zygotes_of.children() if _alive(p.pid)}
        successor = await self.parent()
        assert successor not in served and successor in running
        deadline = time.monotonic() + 10
        while _alive(worn):  # it exits once its last command is reported
            assert time.monotonic() < deadline, "the worn zygote did not exit"
            await trio.sleep(0.01)
        return successor


async def test_a_zygote_with_few_commands_left_hands_over_to_one_already_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    monkeypatch.setattr(zygotes, "MAX_SPAWNS", SPAWNS)
    monkeypatch.setattr(zygotes, "RENEW_AHEAD_SPAWNS", AHEAD)
    commands = Commands(spawner, tmp_path)
    served: list[int] = []  # each generation's zygote
    try:
        async with trio.open_nursery() as nursery:
            commands.runner.bind_nursery(nursery)
            served.append(await commands.parent())
            for _generation in range(2):
                first = served[-1]
                for _ in range(SPAWNS - AHEAD - 1):
                    assert await commands.parent() == first
                assert commands.runner.zygotes_alive == 1  # no successor yet: it has commands to go
                assert await commands.parent() == first  # this one starts the successor
                await commands.until_two_zygotes()
                for _ in range(AHEAD - 1):
                    assert await commands.parent() == first  # the worn one serves to its last
                served.append(await commands.hands_over(first, served))
                assert commands.runner.zygotes_alive == 1  # the successor is fresh: none of its own yet
            nursery.cancel_scope.cancel()
    finally:
        commands.runner.close()
    assert len(set(served)) == 3
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in served):  # closing the runner ends every zygote
        assert time.monotonic() < deadline
        time.sleep(0.01)


async def test_an_old_zygote_hands_over_to_one_already_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    monkeypatch.setattr(zygotes, "MAX_AGE_S", 2.0)
    monkeypatch.setattr(zygotes, "RENEW_AHEAD_S", 1.5)
    commands = Commands(spawner, tmp_path)
    try:
        async with trio.open_nursery() as nursery:
            commands.runner.bind_nursery(nursery)
            first = await commands.parent()
            assert commands.runner.zygotes_alive == 1
            await trio.sleep(0.6)
            assert await commands.parent() == first  # old enough: this one starts the successor
            await commands.until_two_zygotes()
            await trio.sleep(1.5)
            await commands.hands_over(first, [first])
            nursery.cancel_scope.cancel()
    finally:
        commands.runner.close()


async def test_a_command_ends_without_waiting_for_its_zygote_to_leave_its_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    """Moving the zygote out of a call's cgroup can wait out an RCU grace period in the
    kernel (5-30 ms for one command in a hundred here). The call's result no longer waits
    for it: the call's processes are killed one by one, the zygote spared, and nothing of
    the call outlives it."""
    commands = Commands(spawner, tmp_path)
    if not commands.runner.cgroups.base:
        pytest.skip("no cgroups here: zygotes never move")
    real_write = zygotes.write_procs
    slow_moves = 0

    def slow_write(opened: list[int], pid: int) -> bool:
        nonlocal slow_moves
        slow_moves += 1
        time.sleep(SLOW_MOVE_SECONDS)  # as the kernel's grace period would
        return real_write(opened, pid)

    try:
        async with trio.open_nursery() as nursery:
            commands.runner.bind_nursery(nursery)
            zygote = await commands.parent()  # started (and parked) at normal speed
            monkeypatch.setattr(zygotes, "write_procs", slow_write)
            ctx = ToolContext(call_id="c", sandbox=commands.sandbox, config=commands.config)
            started = time.monotonic()
            output = await commands.runner.run(
                commands.shell, ShellArgs(command="sleep 30 >/dev/null 2>&1 & echo $!"), ctx, commands.me
            )
            took = time.monotonic() - started
            left_behind = int(output.content.split()[0])
            assert took < SLOW_MOVE_SECONDS / 2, f"the call waited {took:.2f} s for its zygote's move"
            deadline = time.monotonic() + 5
            while _alive(left_behind):  # killed, though its zygote had not left yet
                assert time.monotonic() < deadline, "the call's background process outlived it"
                await trio.sleep(0.01)
            assert _alive(zygote)
            assert await commands.parent() == zygote  # the spared zygote serves on
            assert slow_moves >= 1
            nursery.cancel_scope.cancel()
    finally:
        commands.runner.close()
