"""A ``SpawnRunner`` in the test process, on a real spawner (the ``spawner`` fixture), the
test playing the protocol process: for tests of zygotes, workers and cgroups below the
daemon's protocol."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import trio

from toold_daemon.config.loading import parse
from toold_daemon.isolation.runner import SpawnRunner
from toold_daemon.sandbox import build_sandbox
from toold_daemon.tools import ToolContext, ToolOutput
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.shell import ShellArgs
from toold_protocol import Identity

SHELL_ALLOWED = '[tools.approval]\nallowlist = ["shell"]\n'


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Commands:
    """``echo $PPID`` through a real runner: which zygote started each command."""

    def __init__(self, spawner: tuple[int, socket.socket], root: Path, config: str = SHELL_ALLOWED) -> None:
        self.config = parse(config)
        self.runner = SpawnRunner(spawner[0], spawner[1], self.config)
        self.sandbox = build_sandbox(self.config, [root])
        self.me = Identity(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())
        self.zygotes_of = psutil.Process(spawner[0])

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """The runner serves (its background jobs in a nursery of their own) for the block,
        and is closed after it, whatever the block raised."""
        try:
            async with trio.open_nursery() as nursery:
                self.runner.bind_nursery(nursery)
                yield
                nursery.cancel_scope.cancel()  # the runner's links serve until cancelled
        finally:
            self.runner.close()

    async def run(self, tool_name: str, args: Any, *, call_id: str = "c") -> ToolOutput:
        tool = next(t for t in builtin_tools() if t.name == tool_name)
        ctx = ToolContext(call_id=call_id, sandbox=self.sandbox, config=self.config)
        return await self.runner.run(tool, args, ctx, self.me)

    async def parent(self) -> int:
        output = await self.run("shell", ShellArgs(command="echo $PPID"))
        return int(output.content.split()[0])

    async def until_two_zygotes(self) -> None:
        deadline = time.monotonic() + 20
        while self.runner.zygotes_alive < 2:
            assert time.monotonic() < deadline, "no successor started"
            await trio.sleep(0.01)

    async def hands_over(self, worn: int, served: list[int]) -> int:
        """The next command goes to a successor that was running before it was sent,
        and the worn zygote then exits."""
        running = {p.pid for p in self.zygotes_of.children() if alive(p.pid)}
        successor = await self.parent()
        assert successor not in served and successor in running
        deadline = time.monotonic() + 10
        while alive(worn):  # it exits once its last command is reported
            assert time.monotonic() < deadline, "the worn zygote did not exit"
            await trio.sleep(0.01)
        return successor

    async def until_zygotes_parked(self) -> None:
        """Until every zygote waits in a fresh cgroup, its last move done (a reach into
        the runner: what a test changes about moves must not catch one under way)."""
        pool = self.runner._zygotes._pool if self.runner._zygotes is not None else {}
        deadline = time.monotonic() + 10
        while any(z.lock.locked() or not z.parked for z in pool.values()):
            assert time.monotonic() < deadline, "a zygote never parked"
            await trio.sleep(0.005)
