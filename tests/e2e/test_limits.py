"""The per-call cgroup limits, on the real kernel: pids.max bounds a call's processes
even for root (whom RLIMIT_NPROC does not bind), and the memory limit holds for the
call as a whole, which per-process rlimits cannot do. Skipped where the daemon reports
no such limit (no writable hierarchy with the controller)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon, start_daemon
from toold_client import Client

PROCESSES = 24
MEMORY_MB = 200
CONFIG = f"""
[tools.approval]
allowlist = ["shell", "run_code"]
[tools.isolation]
processes = {PROCESSES}
address_space_mb = {MEMORY_MB}
"""

FORK_UNTIL_REFUSED = """
import errno, os, time
children, refused = [], ""
for _ in range(200):
    try:
        pid = os.fork()
    except OSError as exc:
        refused = errno.errorcode[exc.errno]
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
print(len(children), refused)
"""

# Three children of 120 MB each: every one fits its own address-space limit, the three
# together do not fit the call's memory limit.
THREE_HOGS = """
import os, time
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        hog = b"x" * (120 << 20)
        time.sleep(1.5)
        os._exit(0)
    children.append(pid)
for pid in children:
    _, status = os.waitpid(pid, 0)
    print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else "exit", os.WEXITSTATUS(status))
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "limits", CONFIG) as d:
        yield d


def cgroup_limits(client: Client) -> str:
    layer = {layer.name: layer for layer in client.hello().isolation}["cgroup"]
    return layer.detail if layer.available else ""


def require_limit(client: Client, name: str) -> None:
    limits = cgroup_limits(client)
    if f"{name} (v" not in limits:
        pytest.skip(f"no per-call {name} limit here: {limits or 'no cgroups'}")


def run_python(client: Client, code: str) -> tuple[bool, str]:
    result = client.call("run_code", {"language": "python", "code": code, "timeout_ms": 30_000})
    return result.ok, result.content


def test_pids_max_bounds_a_call_even_for_root(daemon: DaemonProcess, tmp_path: Path) -> None:
    with daemon.client(timeout=60) as client:
        require_limit(client, "pids")
        ok, content = run_python(client, FORK_UNTIL_REFUSED)
        assert ok, content
        started, refused = content.split()[:2]
        assert refused == "EAGAIN", content
        # The interpreter itself counts too; a fork in the instant the zygote leaves the
        # call's cgroup, before the limit is lowered, may get one process more.
        assert PROCESSES - 1 <= int(started) <= PROCESSES, content
        assert client.ping() >= 0
        again_ok, again = run_python(client, FORK_UNTIL_REFUSED)  # the next call has the whole budget
        assert again_ok and PROCESSES - 1 <= int(again.split()[0]) <= PROCESSES, again


def test_the_memory_limit_holds_for_the_call_as_a_whole(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=60) as client:
        require_limit(client, "memory")
        ok, content = run_python(client, THREE_HOGS)
        lines = [line for line in content.splitlines() if line and not line.startswith("[")]
        # the OOM killer ends at least one hog (or the parent: then the call says so)
        assert "9 0" in lines or (not ok and "SIGKILL" in content), content
        assert client.ping() >= 0
        ok, content = run_python(client, "print(len(b'x' * (120 << 20)))")  # one hog alone fits
        assert ok and "125829120" in content, content


def test_a_stopped_daemon_leaves_no_cgroup_behind(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=30) as client:
            if not cgroup_limits(client):
                pytest.skip("no per-call cgroups here")
            assert client.call("shell", {"command": "true"}).ok  # a zygote and its parked cgroup now exist
            ours = glob.glob(f"/sys/fs/cgroup/**/toold-{d.proc.pid}", recursive=True)
            assert ours
    finally:
        d.stop()
    assert [path for path in ours if os.path.exists(path)] == []
