"""Class N: undo, dry runs and third-party MCP servers are attacked the ways a model, a
file in the workspace or another local user would: secrets copied into the undo store
or named by a dry run, a forged restore call, another user's undo, an MCP server that
turns around and talks to the daemon, a server that floods the registry."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, module_daemon, reachable_daemon
from tests.e2e.test_identity import as_other_user
from tests.e2e.test_mcp_gateway import hostile_entry
from tests.security.test_b_tools_cannot_reach_the_daemon import plant_client
from toold_client import CallSpec, Client, RemoteError

SECRET = "AKIA-undo-must-not-keep-this"
CONFIG = f"""
[tools.approval]
mode = "auto"
allowlist = ["delete_file"]

{hostile_entry("hostile")}
{hostile_entry("networked")}network = true
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "undo-attacks", CONFIG) as d:
        yield d


def state_dir(daemon: DaemonProcess) -> Path:
    return daemon.root.parent / "state"


def test_a_secret_below_a_deleted_directory_is_never_copied_into_the_undo_store(daemon: DaemonProcess) -> None:
    """Attack: a model deletes a directory holding .env, hoping its content lands in the
    daemon's undo store (and comes back to it through an undo elsewhere)."""
    project = daemon.root / "project"
    project.mkdir()
    (project / ".env").write_text(f"AWS_SECRET={SECRET}\n")
    (project / "main.py").write_text("print('hi')\n")
    with daemon.client() as c:
        deleted = c.submit([CallSpec("delete_file", {"path": "project", "recursive": True})])
        assert deleted.results[0].ok, deleted.results[0].content
        assert ".env" in deleted.results[0].content and "not undoable" in deleted.results[0].content
        for blob in (state_dir(daemon) / "undo").iterdir():
            assert SECRET.encode() not in blob.read_bytes()
        undone = c.undo(deleted.batch_id, on_confirm=lambda request: None)
    assert undone.results[0].ok, undone.results[0].content
    assert (project / "main.py").read_text() == "print('hi')\n"
    assert not (project / ".env").exists()  # reported as not undoable, never written back
    assert ".env" in undone.results[0].content


def test_a_dry_run_does_not_name_denied_files(daemon: DaemonProcess) -> None:
    """Attack: a dry-run delete as a way to list files the sandbox hides."""
    keys = daemon.root / "keys"
    keys.mkdir()
    (keys / "id_ed25519").write_text("private\n")
    (keys / "server.pem").write_text("private\n")
    (keys / "readme.txt").write_text("public\n")
    with daemon.client() as c:
        outcome = c.submit([CallSpec("delete_file", {"path": "keys", "recursive": True})], dry_run=True)
    content = outcome.results[0].content
    assert "readme.txt" in content and "2 denied entries" in content
    assert "id_ed25519" not in content and "server.pem" not in content
    assert (keys / "id_ed25519").exists()


def test_a_forged_restore_call_is_refused_whatever_it_names(daemon: DaemonProcess) -> None:
    """Attack: the model submits restore_files itself, naming a pre-image hash it saw in a
    journal listing, to write that content wherever it likes."""
    forged = {
        "undoes": "0:anything",
        "entries": [{"path": "stolen.txt", "expect_kind": "absent", "kind": "file", "hash": "0" * 64}],
        "force": True,
    }
    with daemon.client() as c:
        with pytest.raises(RemoteError) as refused:
            c.submit([CallSpec("read_file", {"path": "."}), CallSpec("restore_files", forged)])
        assert refused.value.code == "INVALID_MESSAGE"
        with pytest.raises(RemoteError):
            c.submit([CallSpec("restore_files", forged)], dry_run=True)
    assert not (daemon.root / "stolen.txt").exists()


def test_undoing_a_batch_that_has_not_ended_is_a_typed_error(daemon: DaemonProcess) -> None:
    """Attack: undo a batch while it still runs, racing its writes."""
    with daemon.client() as c:
        with pytest.raises(RemoteError) as unknown:
            c.undo("no-such-batch")
        assert unknown.value.code == "UNKNOWN_BATCH"
    running = threading.Thread(
        target=lambda: Client(daemon.endpoint, timeout=60).submit(
            [CallSpec("mcp__hostile__sleep", {"seconds": 2})], batch_id="still-running"
        )
    )
    running.start()
    try:
        with daemon.client() as c:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    c.undo("still-running")
                except RemoteError as exc:
                    if exc.code == "BATCH_NOT_ENDED":
                        break
                    assert exc.code == "UNKNOWN_BATCH"  # not submitted yet
                time.sleep(0.05)
            else:
                pytest.fail("an undo of a running batch was not refused")
    finally:
        running.join()


@pytest.mark.parametrize("server", ["hostile", "networked"])
def test_an_mcp_server_cannot_talk_to_the_daemon(daemon: DaemonProcess, server: str) -> None:
    """Attack: a third-party server (or a model steering it) connects to the daemon's
    socket to submit and approve calls of its own. Without network it cannot make a
    socket at all; with network it runs below the spawner, in a call cgroup, so the
    daemon refuses it at the door like any command."""
    script = plant_client(daemon.root).split()[-1].strip("'")
    # Bounded, as the command's twin in test_b is: once in a CI run the planted client,
    # refused, did not exit within the server's 30 s (a refusal now ends it at once).
    argv = ["timeout", "20", sys.executable, script, "--endpoint", daemon.endpoint, "ping", "--wait", "2"]
    with daemon.client(timeout=60) as c:
        result = c.call(f"mcp__{server}__run", {"argv": argv})
        assert result.ok, result.content
        assert "rc=0" not in result.content and "pong" not in result.content, result.content
        c.ping()  # everyone else is still served
    if server == "networked":
        assert "refused a connection" in daemon.log.read_text()


def test_another_user_can_neither_undo_nor_see_a_batch(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path, config=CONFIG) as d:
        (d.root / "notes.txt").write_text("mine\n")
        with Client(d.endpoint) as c:
            c.call("read_file", {"path": "notes.txt"})
            batch = c.submit([CallSpec("write_file", {"path": "notes.txt", "content": "x", "overwrite": True})])

        def attempt(client: Client) -> dict[str, Any]:
            outcome: dict[str, Any] = {}
            for name, action in (
                ("undo", lambda: client.undo(batch.batch_id, force=True)),
                ("get", lambda: client.get_batch(batch.batch_id)),
            ):
                try:
                    action()
                    outcome[name] = "allowed"
                except RemoteError as exc:
                    outcome[name] = exc.code
            return outcome

        seen = as_other_user(d.endpoint, attempt)
        assert seen["undo"] == "UNKNOWN_BATCH" and seen["get"] != "allowed", json.dumps(seen)
        assert (d.root / "notes.txt").read_text() == "x"
