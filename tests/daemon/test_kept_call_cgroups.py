"""A call's cgroup after its call: kept for later calls instead of being removed and made
anew, taken back only once no process is left in it, with its limits written again,
never while another call runs in it; removed later when killed processes outlive the
call; and none outlives the runner.

On the real kernel's hierarchies (whatever this machine mounts), as root."""

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
from toold_daemon.isolation import call_end, cgroup
from toold_daemon.isolation.call_end import CallKiller, CallProcess
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.tools.shell import ShellArgs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups takes root here")


def _sleeping_in(group: Path) -> set[int]:
    """The live ``sleep`` processes listed in cgroup ``group``."""
    found = set()
    try:
        listed = (group / "cgroup.procs").read_text().split()
    except FileNotFoundError:  # removed meanwhile
        return found
    for word in listed:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(int(word)).name() == "sleep" and alive(int(word)):
                found.add(int(word))
    return found


def _pids_max(cgroups: Cgroups, name: str) -> str:
    for hierarchy, path in zip(cgroups.hierarchies, cgroups.dirs(name), strict=True):
        if "pids" in hierarchy.limits:
            return Path(path, "pids.max").read_text().strip()
    pytest.skip("no pids controller here")


def test_an_emptied_call_cgroup_comes_back_with_the_next_calls_limits(cgroups: Cgroups) -> None:
    first = cgroups.call_group(pids_max=16, memory_max=1 << 30)
    assert first.startswith("call-") and _pids_max(cgroups, first) == "16"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        opened = cgroups.open_procs(first)
        assert opened is not None and cgroup.write_procs(opened, sleeper.pid)
        assert not cgroups.release(first)  # a process is still in it: neither kept nor removed
        assert cgroups.spare == [] and all(os.path.isdir(path) for path in cgroups.paths(first))
    finally:
        sleeper.kill()
        sleeper.wait()
    deadline = time.monotonic() + 5
    while not cgroups.release(first):  # the process leaves the cgroup as it is reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert cgroups.spare == [first]
    assert cgroups.call_group(pids_max=513, memory_max=1 << 30) == first
    assert _pids_max(cgroups, first) == "513"  # the new call's limit, not the last one's
    assert cgroups.spare == []
    second = cgroups.call_group(pids_max=8, memory_max=1 << 30)  # none kept: a fresh one
    assert second != first


def test_only_so_many_are_kept_and_none_outlives_the_bases(cgroups: Cgroups, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup, "SPARE_CALL_CGROUPS", 2)
    names = [cgroups.call_group(pids_max=8, memory_max=1 << 30) for _ in range(3)]
    assert all(cgroups.release(name) for name in names)
    assert cgroups.spare == names[:2]
    assert not any(os.path.exists(path) for path in cgroups.paths(names[2]))  # removed instead
    cgroups.remove_bases()
    assert cgroups.spare == []
    assert not any(os.path.exists(h.base) for h in cgroups.hierarchies)


async def test_commands_reuse_cgroups_but_never_share_one(tmp_path: Path, spawner: tuple[int, socket.socket]) -> None:
    """One command after another runs in cgroups taken back from earlier ones; two that run
    at once are each in a cgroup of its own, holding only that call's processes."""
    commands = Commands(spawner, tmp_path)
    if not commands.runner.cgroups.hierarchies:
        pytest.skip(f"no per-call cgroups here: {commands.runner.cgroups.reason}")
    report = "grep -m1 -o 'call-[0-9a-f]*' /proc/self/cgroup"
    async with commands.serving():
        one_by_one = []
        for _ in range(12):
            one_by_one.append((await commands.run("shell", ShellArgs(command=report))).content.strip())
            await trio.sleep(0.02)  # the call's cgroup is given back behind it
        assert all(name.startswith("call-") for name in one_by_one)
        assert len(set(one_by_one)) < len(one_by_one)  # taken back, not made anew each time

        named: dict[str, str] = {}

        async def beside_another(tag: str) -> None:
            command = f"{report}; exec sleep 1"
            named[tag] = (await commands.run("shell", ShellArgs(command=command), call_id=tag)).content.strip()

        base = commands.runner.cgroups.base
        async with trio.open_nursery() as nursery:
            for tag in ("a", "b"):
                nursery.start_soon(beside_another, tag)
            holding: dict[str, set[int]] = {}
            deadline = time.monotonic() + 10
            while len(holding) < 2:  # both sleep: in which cgroups, beside what?
                assert time.monotonic() < deadline, holding
                await trio.sleep(0.02)
                holding = {name: pids for name in os.listdir(base) if name.startswith("call-")
                           if (pids := _sleeping_in(Path(commands.runner.cgroups.paths(name)[0])))}  # fmt: skip
        assert named["a"] != named["b"] and set(named.values()) == set(holding)
        assert all(len(pids) == 1 for pids in holding.values())  # one call's process each, no other
        bases = [h.base for h in commands.runner.cgroups.hierarchies]
    for base in bases:  # the runner closed: kept cgroups and bases removed
        assert not os.path.exists(base)


async def test_a_cgroup_whose_processes_outlive_the_call_is_removed_once_they_exit(
    cgroups: Cgroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a process stuck in the kernel (a hung network filesystem) would: the call ends
    without its cgroup, whose temp dir is not reused, and the cgroup goes once it exits."""
    monkeypatch.setattr(call_end, "EMPTY_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(call_end, "LINGERING_RETRY_SECONDS", 0.05)
    given_back: list[bool] = []

    async def give_back_temp(temp: str, uid: int, *, reusable: bool) -> None:
        given_back.append(reusable)

    name = cgroups.call_group(pids_max=16, memory_max=1 << 30)
    stuck = subprocess.Popen(["sleep", "30"])  # stands in for it: the test ends it itself
    try:
        opened = cgroups.open_procs(name)
        assert opened is not None and cgroup.write_procs(opened, stuck.pid)
        ended = subprocess.Popen(["true"])
        ended.wait()
        call = CallProcess(ended.pid, -1, "token", "", os.getuid(), name, contained=True)
        killer = CallKiller(cgroups, os.getpid(), 0.0, give_back_temp)
        async with trio.open_nursery() as nursery:
            killer.nursery = nursery
            await killer._finish(call, set(), by_cgroup=True)
            assert given_back == [False] and killer.lingering == [name]
            assert all(os.path.isdir(path) for path in cgroups.paths(name))
            stuck.kill()
            stuck.wait()
            with trio.fail_after(10):
                while killer.lingering:
                    await trio.sleep(0.02)
        assert not any(os.path.exists(path) for path in cgroups.paths(name))
        assert name not in cgroups.spare  # removed, not kept
    finally:
        stuck.kill()
        stuck.wait()


def test_a_kept_cgroup_gets_a_new_innermost_cgroup_only_for_calls_that_need_one(cgroups: Cgroups) -> None:
    """In the unified hierarchy a call's processes are in an innermost cgroup, whose id
    the proxy tells a call's connections by: made anew for a proxied call, kept for the
    others (whose sockets cannot reach a proxy's loopback), at no cost to them."""
    name = cgroups.call_group(pids_max=8, memory_max=1 << 30)
    first = cgroups.socket_id(name)
    if not first:
        pytest.skip("no cgroups in the unified hierarchy here")
    assert first == os.stat(cgroups.paths(name)[0]).st_ino
    assert cgroups.release(name)
    assert cgroups.call_group(pids_max=8, memory_max=1 << 30, new_id=False) == name
    assert cgroups.socket_id(name) == first
    assert cgroups.release(name)
    assert cgroups.call_group(pids_max=8, memory_max=1 << 30) == name
    renewed = cgroups.socket_id(name)
    assert renewed not in (0, first) and renewed == os.stat(cgroups.paths(name)[0]).st_ino
