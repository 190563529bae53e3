"""A call's cgroup is kept and given to a later call, perhaps another user's. Nothing of
the call before may be in it then: not a process it left running in the background, not
one hidden in a cgroup it made inside its own (which a root command without Landlock
could do, to be listed nowhere the daemon looks).

On the real kernel's hierarchies, as root, through a real spawner and zygote."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import trio

from tests.in_process_runner import Commands, alive
from toold_daemon.isolation import cgroup
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.tools.shell import ShellArgs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups takes root here")

MARKER = "3017.25"  # the escapee's sleep, told apart from every other


def _call_cgroup_of(pid: int) -> str:
    """The ``call-...`` cgroup ``pid`` is in ("" if none, or gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            name = line.rsplit("/", 1)[-1]
            if name.startswith("call-"):
                return name
    return ""


def _members(cgroups: Cgroups, group: str) -> set[int]:
    return {int(w) for w in Path(cgroups.paths(group)[0], "cgroup.procs").read_text().split()}


def _escapees() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", MARKER] and alive(p.pid)]


async def test_a_background_process_of_an_earlier_call_is_never_in_a_later_calls_cgroup(
    tmp_path: Path, spawner: tuple[int, socket.socket]
) -> None:
    commands = Commands(spawner, tmp_path)
    if not commands.runner.cgroups.hierarchies:
        pytest.skip(f"no per-call cgroups here: {commands.runner.cgroups.reason}")
    report = "grep -m1 -o 'call-[0-9a-f]*' /proc/self/cgroup"
    leave_behind = f"{report}; setsid sleep {MARKER} >/dev/null 2>&1 </dev/null & sleep 0.1"
    async with commands.serving():
        left_in = (await commands.run("shell", ShellArgs(command=leave_behind))).content.strip()
        assert left_in.startswith("call-")
        later: list[str] = []
        for _ in range(6):
            await trio.sleep(0.05)  # the earlier call's cgroup is given back behind it
            async with trio.open_nursery() as nursery:
                nursery.start_soon(commands.run, "shell", ShellArgs(command="exec sleep 0.4"))
                members: set[int] = set()
                with trio.fail_after(10):
                    while not members:  # the later call runs: who shares its cgroup?
                        await trio.sleep(0.02)
                        sleeping = [
                            p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "0.4"]
                        ]
                        group = next((g for pid in sleeping if (g := _call_cgroup_of(pid))), "")
                        if group:
                            members = _members(commands.runner.cgroups, group)
                later.append(group)
                # The zygote started the command there and leaves behind it, in a thread
                # (moves on cgroup v1 can take milliseconds): only its own process stays.
                with trio.move_on_after(0.3):
                    while len(members) > 1:
                        assert not set(_escapees()) & members
                        await trio.sleep(0.01)
                        members = _members(commands.runner.cgroups, group)
                assert not set(_escapees()) & members
                assert [psutil.Process(pid).cmdline() for pid in members if alive(pid)] == [["sleep", "0.4"]]
    assert _escapees() == []  # killed with its call
    assert left_in in later  # the very cgroup it was in served a later call


@pytest.mark.parametrize("where", ["in its processes' cgroup", "beside it"])
def test_a_process_hidden_in_a_cgroup_made_inside_a_calls_is_found_and_the_cgroup_not_kept(
    cgroups: Cgroups, where: str
) -> None:
    """The call's own ``cgroup.procs`` is empty then, and yet it is not: the cgroup is not
    kept while the inner one lives, the kill reaches what hides there in every hierarchy,
    and removing the call's cgroup removes the emptied inner one first. In the unified
    hierarchy the call's processes are in an innermost cgroup inside the call's: one made
    beside that is found too."""
    name = cgroups.call_group(pids_max=16, memory_max=1 << 30)
    places = cgroups.paths(name) if where == "in its processes' cgroup" else cgroups.dirs(name)
    inner = [os.path.join(path, "inner", "deeper") for path in places]
    for path in inner:
        os.makedirs(path)
    hidden = subprocess.Popen(["sleep", "30"])
    try:
        for path in inner:
            Path(path, "cgroup.procs").write_text(str(hidden.pid))
        assert all(Path(path, "cgroup.procs").read_text() == "" for path in cgroups.paths(name))
        assert not cgroups.release(name) and cgroups.spare == []
        assert cgroup.kill_listed(cgroups.dirs(name)[-1])  # listed-pid kill: the v1 way
        assert hidden.wait(timeout=5) != 0
        deadline = time.monotonic() + 5
        while not cgroups.remove(name):  # the inner cgroups first, deepest first
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not any(os.path.exists(path) for path in cgroups.paths(name))
    finally:
        hidden.kill()
        hidden.wait()
