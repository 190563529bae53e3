"""Where the daemon has cgroups, every command and every tool runs in the cgroup made for
it, or not at all: a cgroup that cannot be made is a refusal (or a fresh child that has
its own), never a call run without its limits and its cgroup kill.

Found by a benchmark: a zygote's home cgroup was named after a Python object's id, which
the next zygote's could reuse while the retired one's was still there; the new zygote then
had no home, and every command of its thousand ran outside any call's cgroup, in the
daemon's parent's (here the hierarchies' roots)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.in_process_runner import SHELL_ALLOWED, Commands
from toold_daemon.errors import ToolError
from toold_daemon.isolation import cgroup
from toold_daemon.isolation.cgroup import Cgroups, CgroupUnavailable, Hierarchy
from toold_daemon.tools.read_file import ReadFileArgs
from toold_daemon.tools.shell import ShellArgs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-call cgroups need root here")

WHERE = "cat /proc/self/cgroup"


def _in_call_cgroup(proc_self_cgroup: str) -> bool:
    """Every hierarchy's line names a call's cgroup."""
    lines = [line for line in proc_self_cgroup.splitlines() if line.count(":") >= 2]
    return bool(lines) and all("/call-" in line.split(":", 2)[2] for line in lines if _managed(line))


def _managed(line: str) -> bool:
    """A hierarchy the daemon makes call cgroups in (v2, pids, memory)."""
    _, controllers, _ = line.split(":", 2)
    return controllers in ("", "pids", "memory")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "cgroups", SHELL_ALLOWED) as d:
        yield d


def test_commands_after_their_zygote_was_replaced_still_run_in_their_call_cgroup(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=60) as client:
        first = client.call("shell", {"command": WHERE})
        if "/toold-" not in first.content:
            pytest.skip("no per-call cgroups on this machine")
        assert _in_call_cgroup(first.content), first.content
        for _ in range(1005):  # past the first zygote's thousand commands
            assert client.call("shell", {"command": "true"}).ok
        later = client.call("shell", {"command": WHERE})
    assert _in_call_cgroup(later.content), later.content


def _refusing(
    prefix: str,
    spawner: tuple[int, socket.socket],
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str = SHELL_ALLOWED,
) -> Commands:
    """A runner for which cgroups whose names start with ``prefix`` cannot be made (as
    when the kernel refuses)."""
    commands = Commands(spawner, root, config)
    if not commands.runner.cgroups.base:
        pytest.skip("no cgroups here")
    real_create = Cgroups.create

    def create(self: Cgroups, name: str, *, pids_max: int, memory_max: int) -> str:
        if name.startswith(prefix):
            raise CgroupUnavailable(f"cgroup {name} could not be made: refused by the test")
        return real_create(self, name, pids_max=pids_max, memory_max=memory_max)

    monkeypatch.setattr(Cgroups, "create", create)
    return commands


async def test_a_zygote_without_its_home_hands_commands_to_fresh_children_in_their_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    commands = _refusing("zygote-", spawner, tmp_path, monkeypatch)
    async with commands.serving():
        output = await commands.run("shell", ShellArgs(command=WHERE))
        assert _in_call_cgroup(output.content), output.content
        assert commands.runner.zygotes_alive == 0


@pytest.mark.parametrize("call_id", ["c", "probe"])
async def test_a_command_whose_cgroup_cannot_be_made_does_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket], call_id: str
) -> None:
    """Whatever the call is named: the call id is the client's, and the start's probe (the
    one child that may go on without a cgroup) is known by how it was started, not by it."""
    without_zygotes = SHELL_ALLOWED + "[tools.isolation]\nzygotes = false\n"
    commands = _refusing("call-", spawner, tmp_path, monkeypatch, without_zygotes)
    marker = tmp_path / "ran"
    async with commands.serving():
        with pytest.raises(ToolError) as refused:
            await commands.run("shell", ShellArgs(command=f"touch {marker}"), call_id=call_id)
        assert refused.value.code == "ISOLATION_UNAVAILABLE"
        assert "could not be made" in refused.value.message
    assert not marker.exists()


async def test_a_worker_whose_cgroup_cannot_be_made_is_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: tuple[int, socket.socket]
) -> None:
    commands = _refusing("worker-", spawner, tmp_path, monkeypatch)
    (tmp_path / "f.txt").write_text("hello\n")
    async with commands.serving():
        with pytest.raises(ToolError) as refused:
            await commands.run("read_file", ReadFileArgs(path="f.txt"))
        assert refused.value.code == "ISOLATION_UNAVAILABLE"
        assert commands.runner.workers.live == 0


def test_making_a_cgroup_fails_whole_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that is taken (in any hierarchy), or a limit refused, is an error, and what
    was made of it in the other hierarchies is removed again."""
    first, second = tmp_path / "v2", tmp_path / "pids"
    first.mkdir()
    second.mkdir()
    pids = Hierarchy(base=str(second), version=1, limits=frozenset({"pids"}))
    cgroups = Cgroups(hierarchies=(Hierarchy(base=str(first), version=2), pids))
    assert cgroups.create("call-a", pids_max=8, memory_max=1 << 30) == "call-a"
    assert (second / "call-a" / "pids.max").read_text() == "8"
    (second / "call-b").mkdir()  # taken in the second hierarchy only
    with pytest.raises(CgroupUnavailable, match="call-b"):
        cgroups.create("call-b", pids_max=8, memory_max=1 << 30)
    assert not (first / "call-b").exists()

    def refuse(path: str, text: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(cgroup, "_write_or_raise", refuse)
    with pytest.raises(CgroupUnavailable, match="Permission denied"):
        cgroups.create("call-c", pids_max=8, memory_max=1 << 30)
    assert not (first / "call-c").exists() and not (second / "call-c").exists()
    assert Cgroups().create("call-d", pids_max=8, memory_max=1 << 30) == ""  # no cgroups: nothing to make
