"""What a command never waits for: a zygote to start, when the last one wore out (its
successor is started beside it before), and its zygote's way out of the call's cgroup,
when the call has ended (tens of milliseconds each, now and then).

These tests are the protocol process: a real spawner, real zygotes, real commands."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psutil
import pytest
import trio

from tests.in_process_runner import Commands, alive
from toold_daemon.isolation import zygotes
from toold_daemon.tools.shell import ShellArgs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the spawner runs as root")

SPAWNS = 8  # a zygote's commands, here
AHEAD = 3  # its successor starts when this many are left
SLOW_MOVE_SECONDS = 1.0


async def test_a_zygote_with_few_commands_left_hands_over_to_one_already_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    monkeypatch.setattr(zygotes, "MAX_SPAWNS", SPAWNS)
    monkeypatch.setattr(zygotes, "RENEW_AHEAD_SPAWNS", AHEAD)
    commands = Commands(spawner, tmp_path)
    served: list[int] = []  # each generation's zygote
    async with commands.serving():
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
    assert len(set(served)) == 3
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in served):  # closing the runner ends every zygote
        assert time.monotonic() < deadline
        time.sleep(0.01)


async def test_an_old_zygote_hands_over_to_one_already_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    monkeypatch.setattr(zygotes, "MAX_AGE_S", 2.0)
    monkeypatch.setattr(zygotes, "RENEW_AHEAD_S", 1.5)
    commands = Commands(spawner, tmp_path)
    async with commands.serving():
        first = await commands.parent()
        assert commands.runner.zygotes_alive == 1
        await trio.sleep(0.6)
        assert await commands.parent() == first  # old enough: this one starts the successor
        await commands.until_two_zygotes()
        await trio.sleep(1.5)
        await commands.hands_over(first, [first])


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

    async with commands.serving():
        zygote = await commands.parent()  # started (and parked again) at normal speed
        await commands.until_zygotes_parked()
        monkeypatch.setattr(zygotes, "write_procs", slow_write)
        started = time.monotonic()
        output = await commands.run("shell", ShellArgs(command="sleep 30 >/dev/null 2>&1 & echo $!"))
        took = time.monotonic() - started
        left_behind = int(output.content.split()[0])
        assert took < SLOW_MOVE_SECONDS / 2, f"the call waited {took:.2f} s for its zygote's move"
        deadline = time.monotonic() + 5
        while alive(left_behind):  # killed, though its zygote had not left yet
            assert time.monotonic() < deadline, "the call's background process outlived it"
            await trio.sleep(0.01)
        assert alive(zygote)
        assert await commands.parent() == zygote  # the spared zygote serves on
        assert slow_moves >= 1


async def test_a_running_commands_cgroup_has_the_calls_process_limit_once_its_zygote_left(
    tmp_path: Path, spawner: tuple[int, socket.socket]
) -> None:
    """A zygote waits in the next call's cgroup with room for one more process (itself);
    once it has moved on, the thread that moved it set the call's own limit there."""
    commands = Commands(
        spawner, tmp_path, config='[tools.approval]\nallowlist = ["shell"]\n[tools.isolation]\nprocesses = 37\n'
    )
    hierarchy = next((h for h in commands.runner.cgroups.hierarchies if "pids" in h.limits), None)
    if hierarchy is None:
        pytest.skip("no pids controller here")
    async with commands.serving(), trio.open_nursery() as nursery:
        nursery.start_soon(commands.run, "shell", ShellArgs(command="exec sleep 5"))
        deadline = time.monotonic() + 10
        limit = ""
        while limit != "37":
            assert time.monotonic() < deadline, f"the command's cgroup has pids.max {limit!r}"
            await trio.sleep(0.01)
            limit = _pids_max_of_the_cgroup_running(hierarchy.base, "sleep")
        nursery.cancel_scope.cancel()


def _pids_max_of_the_cgroup_running(base: str, program: str) -> str:
    """``pids.max`` of the call cgroup whose processes include ``program`` ("" while none)."""
    for name in os.listdir(base):
        group = Path(base, name)
        if name.startswith("call-") and any(alive(int(pid)) and psutil.Process(int(pid)).name() == program
                                            for pid in (group / "cgroup.procs").read_text().split()):  # fmt: skip
            return (group / "pids.max").read_text().strip()
    return ""
