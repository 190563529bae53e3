"""A cgroup v1 hierarchy as the one that kills (systems without a usable v2): limits are
written, and the kill reaches processes that left the session, on the real kernel."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from toold_daemon.isolation import cgroup
from toold_daemon.isolation.cgroup import Cgroups, Hierarchy

V1_PIDS = "/sys/fs/cgroup/pids"


@pytest.fixture
def v1_only() -> Iterator[Cgroups]:
    if not any(
        mount == V1_PIDS and fs == "cgroup" and "pids" in options.split(",")
        for mount, _root, fs, options in cgroup._mounts()
    ) or not os.access(V1_PIDS, os.W_OK):
        pytest.skip("no writable cgroup v1 pids hierarchy here")
    base = os.path.join(V1_PIDS, f"toold-test-{os.getpid()}")
    os.mkdir(base)
    try:
        yield Cgroups(hierarchies=(Hierarchy(base=base, version=1, limits=frozenset({"pids"})),))
    finally:  # even after a failure: nothing left running, nothing left behind
        for leftover in [entry.path for entry in os.scandir(base) if entry.is_dir()]:
            cgroup.kill_listed(leftover)
            deadline = time.monotonic() + 5
            while not cgroup._rmdir(leftover) and time.monotonic() < deadline:
                time.sleep(0.01)
        os.rmdir(base)


def test_v1_call_cgroup_limits_and_kills_escapees(v1_only: Cgroups) -> None:
    name = v1_only.create("call-test", pids_max=16, memory_max=1 << 30)
    [path] = v1_only.paths(name)
    with open(os.path.join(path, "pids.max")) as f:
        assert f.read().strip() == "16"
    assert "cgroup.kill" not in v1_only.describe() and "pids (v1)" in v1_only.describe()
    script = f"echo $$ > {path}/cgroup.procs; setsid sleep 300 & setsid sh -c 'sleep 300 & wait' & wait"
    leader = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(_members(path)) < 4 and time.monotonic() < deadline:  # sh, sleep, sh, its sleep
        time.sleep(0.01)
    members = _members(path)
    assert len(members) == 4
    assert len({os.getsid(pid) for pid in members}) == 3  # two of them left the session
    assert v1_only.kill(name)
    leader.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not v1_only.remove(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(path)
    assert not [pid for pid in members if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def _members(path: str) -> list[int]:
    with open(os.path.join(path, "cgroup.procs")) as f:
        return [int(line) for line in f if line.strip()]


@pytest.mark.parametrize(
    ("mount", "root", "own", "expected"),
    [
        ("/sys/fs/cgroup/memory", "/", "/process_api/abc", "/sys/fs/cgroup/memory/process_api/abc"),
        ("/sys/fs/cgroup/memory", "/docker/x", "/docker/x/sub", "/sys/fs/cgroup/memory/sub"),  # a subtree mount
        ("/sys/fs/cgroup/memory", "/docker/x", "/elsewhere", ""),  # our cgroup is not under this mount
        ("/sys/fs/cgroup/memory", "/docker/x", "/docker/xy", ""),  # a sibling whose name merely starts alike
        ("/sys/fs/cgroup", "/", "/", "/sys/fs/cgroup/"),
    ],
)
def test_our_cgroup_is_found_under_a_mount_that_shows_only_a_subtree(
    mount: str, root: str, own: str, expected: str
) -> None:
    assert cgroup._inside(mount, root, own) == expected
