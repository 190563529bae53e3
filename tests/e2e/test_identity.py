"""A client of another uid, for real: the kernel's identity, refused tools, invisible batches.

Runs only as root. The test forks a child that drops to uid/gid 65534 (nobody) before it
connects, so the daemon learns that identity from SO_PEERCRED, not from anything sent.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_daemon import big_tree, grep_calls, submit_raw
from toold_client import Client, RemoteError

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")


def as_nobody(endpoint: str, action: Callable[[Client], dict[str, Any]]) -> dict[str, Any]:
    """Run ``action`` in a forked child running as uid/gid 65534; return what it reports."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        report: dict[str, Any]
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with Client(endpoint, timeout=10) as client:
                report = action(client)
        except BaseException as exc:
            report = {"exception": repr(exc)}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


@pytest.fixture
def daemon(tmp_path: Path, root: Path) -> Iterator[DaemonProcess]:
    """A daemon whose socket lies where another user can reach it (pytest's tmp dirs are 0700)."""
    socket_dir = Path(tempfile.mkdtemp(prefix="toold-shared-"))
    os.chmod(socket_dir, 0o711)
    d = start_daemon(tmp_path, root, socket_dir=socket_dir / "run")
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)


def open_socket_to_everyone(daemon: DaemonProcess) -> None:
    os.chmod(daemon.socket.parent, 0o711)
    os.chmod(daemon.socket, 0o666)


def remote_code(call: Callable[[], object]) -> str:
    try:
        call()
    except RemoteError as exc:
        return exc.code
    return "no error"


def test_another_uid_gets_its_own_identity_and_no_tools(daemon: DaemonProcess) -> None:
    (daemon.root / "secret.txt").write_text("root only")
    os.chmod(daemon.root / "secret.txt", 0o600)
    open_socket_to_everyone(daemon)

    def act(client: Client) -> dict[str, Any]:
        welcome = client.hello()
        result = client.call("read_file", {"path": "secret.txt"})
        return {
            "uid": welcome.identity.uid,
            "gid": welcome.identity.gid,
            "pid": welcome.identity.pid,
            "me": os.getpid(),
            "ok": result.ok,
            "content": result.content,
            "type": result.error.type if result.error else None,
        }

    report = as_nobody(daemon.endpoint, act)
    assert report.get("exception") is None, report
    assert (report["uid"], report["gid"], report["pid"]) == (NOBODY, NOBODY, report["me"])
    assert report["ok"] is False and report["type"] == "IsolationUnavailable"
    assert "root only" not in report["content"]


def test_another_uid_cannot_see_cancel_recover_or_take_over_a_batch(daemon: DaemonProcess) -> None:
    big_tree(daemon.root, 2000)
    open_socket_to_everyone(daemon)
    with daemon.client() as owner:
        accepted = submit_raw(owner, grep_calls(4), batch_id="roots-batch")

        def act(client: Client) -> dict[str, Any]:
            calls = [
                {"id": f"c{i}", "name": "grep", "arguments": {"pattern": "needle", "max_results": 10_000}}
                for i in range(4)
            ]
            return {
                "get": remote_code(lambda: client.get_batch("roots-batch")),
                "cancel": remote_code(lambda: client.cancel("roots-batch")),
                "recover": remote_code(lambda: client.recover("roots-batch", "discard")),
                "resubmit": remote_code(lambda: client.submit(calls, batch_id="roots-batch")),
                "listed": [b.batch_id for b in client.list_batches()],
            }

        report = as_nobody(daemon.endpoint, act)
        finished = owner.wait_batch(accepted.batch_id)
    assert report.get("exception") is None, report
    assert report["get"] == report["cancel"] == report["recover"] == "UNKNOWN_BATCH"
    assert report["resubmit"] == "DUPLICATE_BATCH_ID"
    assert report["listed"] == []
    assert finished.state == "finished" and all(r.ok for r in finished.results)


def test_socket_of_a_default_daemon_is_closed_to_other_users(daemon: DaemonProcess) -> None:
    assert daemon.socket.stat().st_mode & 0o777 == 0o600
    report = as_nobody(daemon.endpoint, lambda client: {"rtt": client.ping(timeout=2)})
    assert "exception" in report and report.get("rtt") is None
    assert Path(daemon.socket).exists()
