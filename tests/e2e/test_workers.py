"""Tool workers, on a real daemon: every Python tool runs in a confined worker process
as the client, never in the daemon; a dead worker costs one call, never the next."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.conftest import DaemonProcess
from toold_client import APPROVE_ALL
from toold_protocol import ToolResult


def workers_of(daemon: DaemonProcess) -> list[int]:
    """The pids in this daemon's worker cgroups."""
    marker = f"/toold-{daemon.proc.pid}/worker-"
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cgroup").read_text():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_reads_run_in_a_worker_not_in_the_daemon(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello")
    with daemon.client(timeout=30) as client:
        layers = {layer.name: layer for layer in client.hello().isolation}
        assert "long-lived workers" in layers["process"].detail
        result = client.call("read_file", {"path": "a.txt"})
    assert result.ok and "hello" in result.content
    workers = workers_of(daemon)
    if not workers:  # no cgroups here: look for the daemon's spawner's other children
        return
    assert daemon.proc.pid not in workers
    # the worker has dropped everything a command drops
    status = Path(f"/proc/{workers[0]}/status").read_text()
    assert "NoNewPrivs:\t1" in status
    assert "CapBnd:\t0000000000000000" in status


def test_a_display_the_worker_sends_once_still_reaches_the_client_whole_and_sanitised(daemon: DaemonProcess) -> None:
    """A tool whose display is its content has it sent once by the worker; the client
    still gets both, the display made safe for a terminal, and a different display as is."""
    (daemon.root / "a.txt").write_text("plain \x1b[31mred\x1b[0m text\n" * 3)
    (daemon.root / "b.txt").write_text("hello\n")
    with daemon.client(timeout=30) as client:
        read = client.call("read_file", {"path": "a.txt"})
        assert client.call("read_file", {"path": "b.txt"}).ok  # an edit needs a read first
        change = {"path": "b.txt", "edits": [{"target": "hello", "replacement": "HELLO"}]}
        edit = client.call("edit_file", change, on_confirm=lambda _: APPROVE_ALL, timeout=30)
    assert read.ok and read.content.count("red") == 3
    assert "\x1b" not in read.display and read.display.count("red") == 3
    assert edit.ok and edit.display != edit.content and "+HELLO" in edit.display


def test_a_worker_killed_mid_call_fails_that_call_and_the_next_succeeds(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello")
    with daemon.client(timeout=30) as client:
        assert client.call("read_file", {"path": "a.txt"}).ok  # a warm, idle worker
        workers = workers_of(daemon)
        if not workers:
            import pytest

            pytest.skip("no cgroups: the test finds workers by their cgroup")
        for pid in workers:  # the next call is sent to a worker that cannot answer
            os.kill(pid, signal.SIGSTOP)
        results: list[ToolResult] = []
        caller = threading.Thread(target=lambda: results.append(client.call("read_file", {"path": "a.txt"})))
        caller.start()
        time.sleep(0.5)
        assert not results, "the stopped worker answered"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        caller.join(20)
        [killed] = results
        assert not killed.ok and killed.error is not None
        assert killed.error.code == "WORKER_DIED" and "mid-call" in killed.error.message
        after = client.call("read_file", {"path": "a.txt"})
        assert after.ok and "hello" in after.content
        assert not set(workers) & set(workers_of(daemon))


def test_a_worker_that_died_while_idle_is_never_handed_a_call(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello")
    with daemon.client(timeout=30) as client:
        assert client.call("read_file", {"path": "a.txt"}).ok
        workers = workers_of(daemon)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        for _ in range(3):
            result = client.call("list_directory", {"path": "."})
            assert result.ok and "a.txt" in result.content


def test_a_timed_out_python_tool_ends_its_worker_and_says_so(tmp_path: Path, root: Path) -> None:
    from tests.conftest import start_daemon

    d = start_daemon(tmp_path, root, config="[tools.timeouts]\nfile_operations_seconds = 0.5\n")
    try:
        (root / "a.txt").write_text("hello")
        with d.client(timeout=30) as client:
            assert client.call("read_file", {"path": "a.txt"}).ok
            workers = workers_of(d)
            for pid in workers:
                os.kill(pid, signal.SIGSTOP)  # a tool that never returns
            timed_out = client.call("read_file", {"path": "a.txt"})
            assert timed_out.error is not None and timed_out.error.type == "Timeout"
            assert "worker was stopped" in timed_out.content
            deadline = time.monotonic() + 5
            while any(_alive(pid) for pid in workers):  # the kill lands asynchronously
                assert time.monotonic() < deadline, "the timed-out call's worker lives on"
                time.sleep(0.01)
            assert client.call("read_file", {"path": "a.txt"}).ok
    finally:
        d.stop()
