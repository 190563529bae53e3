"""A zygote's move into a fresh cgroup runs beside the event loop, not on it: writing a
pid to ``cgroup.procs`` may wait out an RCU grace period in the kernel (milliseconds),
and on the loop that wait stalled every client's calls."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import trio

from toold_daemon.isolation import zygotes
from toold_daemon.isolation.cgroup import Cgroups, Hierarchy
from toold_daemon.isolation.zygotes import Zygote

SLOW_MOVE_SECONDS = 0.3


def _zygote(tmp_path: Path) -> tuple[Zygote, list[str]]:
    """A zygote record over a hierarchy of plain directories whose ``cgroup.procs`` are
    files: what the zygote writes there can be read back. Processes join a cgroup's
    innermost one (of the same name, in the unified hierarchy)."""
    base = tmp_path / "toold-test"
    (base / "home" / "home").mkdir(parents=True)
    (base / "home" / "home" / "cgroup.procs").touch()
    cgroups = Cgroups(hierarchies=(Hierarchy(base=str(base), version=2),))
    made: list[str] = []

    def new_group() -> str:
        name = f"call-{len(made)}"
        (base / name / name).mkdir(parents=True)
        (base / name / name / "cgroup.procs").touch()
        made.append(name)
        return name

    ours, _theirs = socket.socketpair()
    zygote = Zygote(
        pid=4242,
        sock=trio.socket.from_stdlib_socket(ours),
        home="home",
        layers={},
        cgroups=cgroups,
        new_group=new_group,
    )
    return zygote, made


async def test_a_slow_move_leaves_the_event_loop_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zygote, made = _zygote(tmp_path)
    zygote.inside = "call-before"
    real_write = zygotes.write_procs

    def slow_write(opened: list[int], pid: int) -> bool:
        time.sleep(SLOW_MOVE_SECONDS)  # as the kernel's grace period would
        return real_write(opened, pid)

    monkeypatch.setattr(zygotes, "write_procs", slow_write)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        started = trio.current_time()
        assert await zygote.park()
        nursery.cancel_scope.cancel()
    assert trio.current_time() - started >= SLOW_MOVE_SECONDS
    assert ticks >= 10, f"the loop ran {ticks} times while the zygote moved"  # 0 on the loop
    assert (zygote.parked, zygote.inside) == (made[0], "")
    assert (tmp_path / "toold-test" / made[0] / made[0] / "cgroup.procs").read_text() == "4242"


async def test_a_refused_move_sends_the_zygote_home_and_drops_the_fresh_cgroup(tmp_path: Path) -> None:
    zygote, made = _zygote(tmp_path)
    zygote.new_group = lambda: _without_procs(tmp_path, made)
    zygote.inside = "call-before"
    assert await zygote.park()  # it left the call's cgroup, for its home
    assert (zygote.parked, zygote.inside) == ("", "")
    assert (tmp_path / "toold-test" / "home" / "home" / "cgroup.procs").read_text() == "4242"
    assert not (tmp_path / "toold-test" / made[0]).exists()


def _without_procs(tmp_path: Path, made: list[str]) -> str:
    """A fresh cgroup whose ``cgroup.procs`` cannot be opened (the move is refused)."""
    name = f"call-{len(made)}"
    os.mkdir(tmp_path / "toold-test" / name)
    made.append(name)
    return name
