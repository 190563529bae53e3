"""A client of another uid, for real: the kernel's identity, its own privileges, invisible batches.

Runs only as root. A throwaway system user is created for the test run (and removed at
exit; ``nobody`` where ``useradd`` is missing). The test forks a child that drops to that
uid/gid before it connects, so the daemon learns the identity from SO_PEERCRED, not from
anything sent.
"""

from __future__ import annotations

import atexit
import json
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import DaemonProcess, open_socket_to_everyone, reachable_daemon
from tests.e2e.test_daemon import big_tree, grep_calls, submit_raw
from toold_client import Client, RemoteError
from toold_protocol import Identity


def _throwaway_user() -> tuple[int, int]:
    """(uid, gid) of a fresh system user for this run; RLIMIT_NPROC then counts only our processes."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return 65534, 65534
    name = f"toold-t{os.getpid()}"
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        return 65534, 65534
    atexit.register(lambda: subprocess.run(["userdel", name], capture_output=True, check=False))
    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


OTHER_UID, OTHER_GID = _throwaway_user()
SHELL_ALLOWED = """
[tools.approval]
allowlist = ["shell", "run_code"]

[tools.isolation]
processes = 200
"""
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")


def as_other_user(endpoint: str, action: Callable[[Client], dict[str, Any]]) -> dict[str, Any]:
    """Run ``action`` in a forked child running as the throwaway user; return what it reports."""
    return as_user(endpoint, OTHER_UID, OTHER_GID, action)


def as_user(endpoint: str, uid: int, gid: int, action: Callable[[Client], dict[str, Any]]) -> dict[str, Any]:
    """Run ``action`` in a forked child that has dropped to ``uid``/``gid`` before it
    connects; return what it reports (``{"exception": ...}`` if it raised)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        report: dict[str, Any]
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with Client(endpoint, timeout=20) as client:
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
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose root and socket another user could reach; the socket keeps its
    default mode until a test opens it."""
    with reachable_daemon(tmp_path, config=SHELL_ALLOWED, open_socket=False) as d:
        yield d


def remote_code(call: Callable[[], object]) -> str:
    try:
        call()
    except RemoteError as exc:
        return exc.code
    return "no error"


def test_another_uid_gets_its_own_identity_and_its_own_privileges(daemon: DaemonProcess) -> None:
    """Tools for another uid run in a child of that uid: a root-only file stays unreadable,
    a world-readable one is read, and a shell command reports the peer's uid."""
    (daemon.root / "secret.txt").write_text("root only")
    os.chmod(daemon.root / "secret.txt", 0o600)
    (daemon.root / "public.txt").write_text("for everyone")
    os.chmod(daemon.root, 0o755)
    open_socket_to_everyone(daemon)

    def act(client: Client) -> dict[str, Any]:
        welcome = client.hello()
        secret = client.call("read_file", {"path": "secret.txt"})
        public = client.call("read_file", {"path": "public.txt"})
        shell = client.call("shell", {"command": "id -u; id -g; cat secret.txt"})
        return {
            "uid": welcome.identity.uid,
            "gid": welcome.identity.gid,
            "pid": welcome.identity.pid,
            "me": os.getpid(),
            "secret": [secret.ok, secret.content, secret.error.type if secret.error else None],
            "public": [public.ok, public.content],
            "shell": [shell.ok, shell.content],
        }

    report = as_other_user(daemon.endpoint, act)
    assert report.get("exception") is None, report
    assert (report["uid"], report["gid"], report["pid"]) == (OTHER_UID, OTHER_GID, report["me"])
    ok, content, kind = report["secret"]
    assert ok is False and kind == "PermissionDenied", content
    assert "root only" not in content
    assert report["public"] == [True, "for everyone"]
    ok, content = report["shell"]
    assert ok is False  # cat fails: non-zero exit
    assert content.splitlines()[2:4] == [str(OTHER_UID), str(OTHER_GID)], content
    assert "root only" not in content and "Permission denied" in content


def test_another_uid_lists_only_its_own_servers_connections(daemon: DaemonProcess, tmp_path: Path) -> None:
    """The journal's connections of MCP servers are listed per uid, as batches are (root:
    everyone's). The rows are written straight into the daemon's journal, as its egress
    bookkeeping writes them."""
    import sqlite3

    from toold_daemon.records import server_connections

    journal = sqlite3.connect(tmp_path / "state" / "journal.sqlite3", isolation_level=None)
    record = {"host": "example.test", "port": 443, "protocol": "connect", "allowed_by": "allowed_domains"}
    for server, uid in (("mcp:roots", 0), ("mcp:theirs", OTHER_UID), ("mcp:other", OTHER_UID)):
        owner = Identity(uid=uid, gid=uid, pid=1)
        journal.execute(server_connections.INSERT, server_connections.row(server, owner, record, time.time()))
    journal.close()
    open_socket_to_everyone(daemon)

    def act(client: Client) -> dict[str, Any]:
        return {
            "all": sorted(c.server for c in client.list_connections()),
            "one": [c.server for c in client.list_connections("mcp:theirs")],
            "roots": [c.server for c in client.list_connections("mcp:roots")],
        }

    report = as_other_user(daemon.endpoint, act)
    assert report == {"all": ["mcp:other", "mcp:theirs"], "one": ["mcp:theirs"], "roots": []}, report
    with daemon.client() as root:
        assert sorted(c.server for c in root.list_connections()) == ["mcp:other", "mcp:roots", "mcp:theirs"]
        assert len(root.list_connections(limit=1)) == 1


def test_another_uid_cannot_see_cancel_recover_take_over_or_block_a_batch(daemon: DaemonProcess) -> None:
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
                "full id": remote_code(lambda: client.get_batch(accepted.batch_id)),
                "resubmit": remote_code(lambda: client.submit(calls, batch_id="roots-batch")),
                "mine": client.get_batch("roots-batch").batch_id,
                "listed": [b.batch_id for b in client.list_batches()],
            }

        report = as_other_user(daemon.endpoint, act)
        finished = owner.wait_batch(accepted.batch_id)
    assert report.get("exception") is None, report
    assert report["get"] == report["cancel"] == report["recover"] == report["full id"] == "UNKNOWN_BATCH"
    # Batch ids are namespaced per uid: the same id is another user's own batch, which
    # neither blocks theirs nor tells them the id was used.
    assert accepted.batch_id == "0:roots-batch"
    assert report["resubmit"] == "no error"
    assert report["mine"] == f"{OTHER_UID}:roots-batch"
    assert report["listed"] == [f"{OTHER_UID}:roots-batch"]
    assert finished.state == "finished" and all(r.ok for r in finished.results)


def test_socket_of_a_default_daemon_is_closed_to_other_users(daemon: DaemonProcess) -> None:
    assert daemon.socket.stat().st_mode & 0o777 == 0o600
    report = as_other_user(daemon.endpoint, lambda client: {"rtt": client.ping(timeout=2)})
    assert "exception" in report and report.get("rtt") is None
    assert Path(daemon.socket).exists()


def test_fork_bomb_of_another_uid_ends_and_the_daemon_keeps_serving(daemon: DaemonProcess) -> None:
    """RLIMIT_NPROC holds for a non-root uid; the timeout then kills what the bomb made."""
    open_socket_to_everyone(daemon)

    def act(client: Client) -> dict[str, Any]:
        started = time.monotonic()
        result = client.call("shell", {"command": "bomb() { bomb | bomb & }; bomb; sleep 5", "timeout_ms": 3000})
        return {
            "ok": result.ok,
            "type": result.error.type if result.error else None,
            "took": time.monotonic() - started,
        }

    report = as_other_user(daemon.endpoint, act)
    assert report.get("exception") is None, report
    assert report["ok"] is False and report["took"] < 20, report
    with daemon.client(timeout=10) as client:
        assert client.ping(timeout=5) > 0
    time.sleep(0.3)
    # Left running as that uid: its zygote (a copy of the daemon that starts its commands),
    # and nothing else.
    daemon_cmdline = psutil.Process(daemon.proc.pid).cmdline()
    left = [
        proc
        for proc in psutil.process_iter(["uids", "cmdline"])
        if proc.info["uids"] and proc.info["uids"].real == OTHER_UID and proc.info["cmdline"] != daemon_cmdline
    ]
    assert left == []


def test_a_network_off_call_of_another_uid_keeps_that_uid(daemon: DaemonProcess) -> None:
    """Cutting the network puts the call in a user namespace of its own; a process that is
    not dumpable cannot write its own uid map, and everything would then run as the
    overflow uid (65534), seen and written. The uid stays the client's."""
    os.chmod(daemon.root, 0o777)
    open_socket_to_everyone(daemon)

    def act(client: Client) -> dict[str, Any]:
        ran = client.call("run_code", {"language": "bash", "code": "id -u; id -g"})
        listing = client.call("list_directory", {"path": "."})  # a worker: network off too
        return {"ran": [ran.ok, ran.content], "listing": listing.ok}

    report = as_other_user(daemon.endpoint, act)
    assert report.get("exception") is None, report
    ok, content = report["ran"]
    assert ok, content
    assert content.split()[:2] == [str(OTHER_UID), str(OTHER_GID)], content
    assert report["listing"]
