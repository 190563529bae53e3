"""One ``Client`` shared by several threads, against a real daemon: an editor's threads
may share the connection. A ZeroMQ socket used by two threads at once corrupts libzmq's
state: one thread waited forever, and closing the client aborted the whole process
("Assertion failed: _term_acks > 0"). Each scenario runs in a process of its own, so
that such an abort fails the test instead of ending the test run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon, start_daemon

CONFIG = '[tools.approval]\nallowlist = ["shell"]\n'

SCENARIOS = r"""
import json, sys, threading, time
from toold_client import APPROVE_ALL, Client, DaemonUnavailable

endpoint, scenario = sys.argv[1], sys.argv[2]
report = {}

def in_threads(*targets, wait=30.0):
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
    return [t.is_alive() for t in threads]

with Client(endpoint, timeout=20) as client:
    if scenario == "reads":
        wrong = []
        def reads():
            for n in range(300):
                result = client.call("read_file", {"path": "f.txt"})
                if not (result.ok and result.content == "shared\n"):
                    wrong.append(result.content)
        report["stuck"] = in_threads(reads, reads, reads)
        report["wrong"] = wrong[:3]
    elif scenario == "beside a long call":
        took = []
        def long_call():
            took.append(("shell", client.call("shell", {"command": "sleep 2"}).ok))
        def reads():
            time.sleep(0.3)  # the shell call is waiting by now
            started = time.monotonic()
            for n in range(20):
                assert client.call("read_file", {"path": "f.txt"}).ok
            took.append(("reads", time.monotonic() - started))
        report["stuck"] = in_threads(long_call, reads)
        report["took"] = took
    elif scenario == "approver beside a submitter":
        answered = []
        def approver():
            pending = client.subscribe()  # (a request made before this is among these)
            request = pending[0] if pending else client.next_confirmation(timeout=None)  # no limit
            client.confirm(request.correlation_id, APPROVE_ALL)
            answered.append(request.batch_id)
        def submitter():
            time.sleep(0.3)
            result = client.call("shell", {"command": "echo asked"}, approval_timeout=15)
            answered.append(result.content.strip())
        report["stuck"] = in_threads(approver, submitter)
        report["answered"] = answered
    elif scenario == "closed while another waits":
        seen = []
        def waiter():
            try:
                client.call("shell", {"command": "sleep 5"})
                seen.append("finished")
            except DaemonUnavailable as exc:
                seen.append(str(exc))
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        time.sleep(0.5)
        client.close()
        thread.join(10)
        report["stuck"] = [thread.is_alive()]
        report["seen"] = seen
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "shared", CONFIG) as d:
        (d.root / "f.txt").write_text("shared\n")
        yield d


def scenario(daemon: DaemonProcess, name: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCENARIOS, daemon.endpoint, name], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    report: dict[str, object] = json.loads(proc.stdout)
    assert report["stuck"] == [False] * len(report["stuck"]), report  # type: ignore[arg-type]
    return report


def test_threads_sharing_a_client_each_get_their_own_results(daemon: DaemonProcess) -> None:
    report = scenario(daemon, "reads")
    assert report["wrong"] == []


def test_a_thread_waiting_for_a_long_call_does_not_hold_up_the_others(daemon: DaemonProcess) -> None:
    took = dict(scenario(daemon, "beside a long call")["took"])  # type: ignore[call-overload]
    assert took["shell"] is True
    assert took["reads"] < 1.5, took  # 20 reads while the 2 s command ran, not after it


def test_an_approver_waiting_without_a_limit_answers_a_submitter_in_another_thread(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    asking = start_daemon(tmp_path, root)  # shell is asked about by default
    try:
        answered = scenario(asking, "approver beside a submitter")["answered"]
    finally:
        asking.stop()
    assert isinstance(answered, list) and len(answered) == 2, answered
    assert any(str(a).startswith("asked") for a in answered), answered


def test_closing_a_client_another_thread_waits_on_ends_that_wait(daemon: DaemonProcess) -> None:
    seen = scenario(daemon, "closed while another waits")["seen"]
    assert seen == ["this client was closed"], seen
