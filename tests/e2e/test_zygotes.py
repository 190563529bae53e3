"""Commands start from a pre-confined zygote: reused, never swept, replaced when it dies."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import DaemonProcess, module_daemon, start_daemon

CONFIG = '[tools.approval]\nallowlist = ["shell"]\n'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "zygotes", CONFIG) as d:
        yield d


def parent_of_command(daemon: DaemonProcess) -> int:
    with daemon.client(timeout=30) as client:
        result = client.call("shell", {"command": "echo $PPID"})
    assert result.ok, result.content
    return int(result.content.split()[0])


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_commands_of_one_kind_share_a_zygote_that_no_sweep_can_reach(daemon: DaemonProcess) -> None:
    first, second = parent_of_command(daemon), parent_of_command(daemon)
    assert first == second  # the same zygote started both
    zygote = psutil.Process(first)
    assert zygote.ppid() in [c.pid for c in psutil.Process(daemon.proc.pid).children()]  # a spawner child
    assert "TOOLD_CALL" not in zygote.environ()  # so no call's sweep matches it
    assert os.getpgid(first) != os.getpgid(daemon.proc.pid)
    with daemon.client() as client:  # a command's group is its own, not the zygote's
        group = client.call("shell", {"command": "ps -o pgid= -p $$"}).content.split()[0]
    assert int(group) != os.getpgid(first)
    assert zygote.is_running()


def test_a_killed_zygote_is_replaced_and_no_call_fails(daemon: DaemonProcess) -> None:
    old = parent_of_command(daemon)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not gone(old):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert parent_of_command(daemon) != old  # the dead zygote is noticed: a fresh child runs it
    replacement = parent_of_command(daemon)  # and a new zygote serves the calls after it
    assert replacement != old
    assert parent_of_command(daemon) == replacement


def test_without_zygotes_each_command_gets_a_fresh_child(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config=CONFIG + "[tools.isolation]\nzygotes = false\n")
    try:
        assert parent_of_command(d) != parent_of_command(d)
    finally:
        d.stop()


def test_one_zygote_watches_many_commands_with_one_thread(daemon: DaemonProcess) -> None:
    zygote = psutil.Process(parent_of_command(daemon))
    with daemon.client(timeout=30) as client:
        jobs = [client.call("shell", {"command": f"echo {i}; sleep 30", "background": True}) for i in range(6)]
        assert all(job.ok for job in jobs), [job.content for job in jobs]
        assert {psutil.Process(job.data["pid"]).ppid() for job in jobs} == {zygote.pid}
        assert zygote.num_threads() == 1  # no thread per command: one event loop
        quick = client.call("shell", {"command": "echo still-served"})  # while six run
        assert quick.ok and "still-served" in quick.content
        for job in jobs:
            assert client.call("shell_jobs", {"action": "kill", "job_id": job.data["job_id"]}).ok


_STATUS_OF_ITS_FAMILY = (
    "grep SigIgn /proc/self/status; grep SigIgn /proc/$PPID/status; "
    'for kin in $(cat /proc/$PPID/task/*/children); do [ "$kin" = $$ ] || grep SigIgn /proc/$kin/status; done'
)


def _ignores(sig_ign_line: str, signum: int) -> bool:
    return bool(int(sig_ign_line.split()[1], 16) & (1 << (signum - 1)))


@pytest.mark.parametrize("zygotes", [True, False])
def test_commands_get_default_signals_and_the_processes_around_them_ignore_sigpipe(
    tmp_path: Path, root: Path, zygotes: bool
) -> None:
    """A command gets SIGPIPE and SIGXFSZ at their defaults, as from a shell (a pipeline's
    writer ends when its reader does; a file size limit stops a writer). The processes
    around it are Python that writes to pipes and sockets whose readers may go: its
    parent (a zygote, or the child that supervises it) and the egress process beside it
    must ignore SIGPIPE (a write then fails; before, it killed the egress process, with
    every command's proxy and the records on their way)."""
    config = CONFIG + ("" if zygotes else "[tools.isolation]\nzygotes = false\n")
    d = start_daemon(tmp_path, root, config=config)
    try:
        with d.client(timeout=30) as client:
            result = client.call("shell", {"command": _STATUS_OF_ITS_FAMILY})
    finally:
        d.stop()
    assert result.ok, result.content
    command, parent, *beside = [line for line in result.content.splitlines() if line.startswith("SigIgn")]
    assert not _ignores(command, signal.SIGPIPE) and not _ignores(command, signal.SIGXFSZ)
    # nothing ignored at all, but the two signals glibc keeps for itself below SIGRTMIN
    assert [sig for sig in range(1, signal.NSIG) if _ignores(command, sig)] in ([], [32, 33])
    assert _ignores(parent, signal.SIGPIPE)
    assert beside, "the egress process beside the command"  # proxy mode is the default
    assert all(_ignores(line, signal.SIGPIPE) for line in beside)
