"""Undo a batch and dry runs, against real daemons: exact bytes and modes back after a
restart, conflicts refused unless forced, only the owner may undo, an undo undone
redoes, and a dry run changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, DaemonProcess, reachable_daemon, start_daemon
from tests.e2e.test_identity import as_other_user
from toold_client import CallSpec, Client, RemoteError

CONFIG = """
[tools.approval]
mode = "auto"
allowlist = ["shell", "delete_file"]
"""

PATCH = """*** Begin Patch
*** Update File: patched.txt
@@
-one
+uno
*** End Patch"""


def batch_calls() -> list[CallSpec]:
    return [
        CallSpec("write_file", {"path": "sub/new.txt", "content": "created\n"}, "create"),
        CallSpec("read_file", {"path": "edited.txt"}, "read"),
        CallSpec("edit_file", {"path": "edited.txt", "edits": [{"target": "old", "replacement": "new"}]}, "edit"),
        CallSpec("delete_file", {"path": "odd-mode.bin"}, "delete"),
        CallSpec("move_file", {"source": "moved.txt", "destination": "there.txt"}, "move"),
        CallSpec("shell", {"command": "echo side effect > shell.txt"}, "shell"),
    ]


def seed(root: Path) -> dict[str, tuple[bytes, int]]:
    (root / "edited.txt").write_bytes(b"old line\r\nno newline at end")
    os.chmod(root / "edited.txt", 0o640)
    (root / "odd-mode.bin").write_bytes(bytes(range(256)) * 3)
    os.chmod(root / "odd-mode.bin", 0o4604 & 0o777 | 0o1000)  # sticky and unusual bits
    (root / "moved.txt").write_bytes(b"move me\n")
    os.chmod(root / "moved.txt", 0o600)
    return snapshot(root)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(root))] = (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return found


def restart(daemon: DaemonProcess, tmp: Path) -> DaemonProcess:
    daemon.stop()
    return start_daemon(tmp, daemon.root, config=CONFIG)


def toolctl(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "toolctl"), "--endpoint", daemon.endpoint, *args], capture_output=True, text=True, timeout=60
    )


def test_undo_after_a_restart_restores_exact_bytes_and_modes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = seed(root)
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with daemon.client() as c:
            outcome = c.submit(batch_calls(), batch_id="agent-mistake")
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results if not r.ok]
        assert (root / "sub" / "new.txt").exists() and not (root / "odd-mode.bin").exists()
        daemon = restart(daemon, tmp_path)
        undone = toolctl(daemon, "undo", "agent-mistake", "--json")
        assert undone.returncode == 0, undone.stdout + undone.stderr
        report = json.loads(undone.stdout)
        assert report["data"]["irreversible"] and "shell" in report["data"]["irreversible"][0]
        after = snapshot(root)
        after.pop("shell.txt")  # a command's effect: reported, not reversed
        assert after == before  # bytes and modes, created file gone, deleted and moved back
        assert not (root / "there.txt").exists()
        # The undo is a batch of its own: undoing it redoes the changes.
        redone = toolctl(daemon, "undo", report["batch_id"])
        assert redone.returncode == 0, redone.stdout + redone.stderr
        assert (root / "sub" / "new.txt").read_text() == "created\n"
        assert (root / "edited.txt").read_bytes() == b"new line\r\nno newline at end"
        assert not (root / "odd-mode.bin").exists() and (root / "there.txt").read_bytes() == b"move me\n"
    finally:
        daemon.stop()


def test_a_path_changed_since_is_refused_unless_forced(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    seed(root)
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with daemon.client() as c:
            c.submit(batch_calls(), batch_id="b")
        (root / "there.txt").write_text("edited by a person since\n")
        refused = toolctl(daemon, "undo", "b")
        assert refused.returncode == 1 and "there.txt" in refused.stderr
        assert (root / "sub" / "new.txt").exists()  # nothing else was applied
        assert (root / "edited.txt").read_bytes().startswith(b"new")
        forced = toolctl(daemon, "undo", "b", "--force")
        assert forced.returncode == 0, forced.stdout
        assert (root / "moved.txt").read_bytes() == b"move me\n" and not (root / "there.txt").exists()
        assert (root / "edited.txt").read_bytes().startswith(b"old")
    finally:
        daemon.stop()


def test_a_recursive_delete_stopped_midway_says_what_it_deleted_and_undo_brings_it_back(tmp_path: Path) -> None:
    """A delete that fails after deleting part of a tree (here: its directory ``t`` is
    immutable, so ``t/sub`` cannot go once emptied) said only "Operation not permitted",
    kept no undo data, and the deleted files were lost for good."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr for an immutable directory")
    root = tmp_path / "root"
    (root / "t/sub").mkdir(parents=True)
    (root / "t/sub/b.txt").write_text("b\n")
    (root / "t/sub/c.bin").write_bytes(bytes(range(256)))
    os.chmod(root / "t/sub/c.bin", 0o600)
    before = snapshot(root)
    if subprocess.run(["chattr", "+i", str(root / "t")], capture_output=True, check=False).returncode:
        pytest.skip("this filesystem has no immutable attribute")
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with daemon.client() as c:
            result = c.call("delete_file", {"path": "t", "recursive": True})
            assert not result.ok and result.content.startswith("Error (PermissionDenied): Operation not permitted")
            assert "before it failed it changed 2 path(s): " in result.content, result.content
            assert "t/sub/b.txt" in result.content and "t/sub/c.bin" in result.content
            assert "toolctl undo puts them back" in result.content
            assert not (root / "t/sub/b.txt").exists()  # it did delete them
            undone = c.undo(c.list_batches(limit=1)[0].batch_id)
            assert all(r.ok for r in undone.results), [r.content for r in undone.results]
        assert snapshot(root) == before  # bytes and modes
    finally:
        daemon.stop()
        subprocess.run(["chattr", "-i", str(root / "t")], check=False)


def test_another_user_cannot_undo(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path, config=CONFIG) as daemon:
        (daemon.root / "mine.txt").write_text("v1\n")
        with Client(daemon.endpoint) as c:
            c.call("read_file", {"path": "mine.txt"})
            written = c.submit([CallSpec("write_file", {"path": "mine.txt", "content": "v2\n", "overwrite": True})])
            assert written.results[0].ok
            full_id = written.batch_id

        def undo(client: Client) -> dict[str, Any]:
            try:
                client.undo(full_id)
            except RemoteError as exc:
                return {"refused": exc.code}
            return {"refused": None}

        assert as_other_user(daemon.endpoint, undo)["refused"] == "UNKNOWN_BATCH"  # not even its existence
        assert (daemon.root / "mine.txt").read_text() == "v2\n"


def test_a_file_past_the_bound_is_marked_not_undoable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "big.txt").write_text("x" * 1000)
    config = CONFIG + "\n[journal]\nundo_max_bytes_per_batch = 100\n"
    daemon = start_daemon(tmp_path, root, config=config)
    try:
        with daemon.client() as c:
            c.call("read_file", {"path": "big.txt"})
            result = c.call("write_file", {"path": "big.txt", "content": "small", "overwrite": True})
        assert result.ok and "not undoable" in result.content
        assert result.data is not None and result.data["not_undoable"][0].endswith("(over the batch's undo bound)")
    finally:
        daemon.stop()


def test_restore_files_cannot_be_submitted_by_a_client(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with daemon.client() as c:
            assert "restore_files" not in {t.name for t in c.tools()}
            with pytest.raises(RemoteError) as refused:
                c.call("restore_files", {"undoes": "x", "entries": []})
            assert refused.value.code == "INVALID_MESSAGE"
    finally:
        daemon.stop()


def test_dry_runs_change_nothing_and_show_the_diff(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    seed(root)
    (root / "patched.txt").write_text("one\ntwo\n")
    before = snapshot(root)
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        calls = [
            CallSpec("write_file", {"path": "brand-new.txt", "content": "hello\n"}, "write"),
            CallSpec("edit_file", {"path": "edited.txt", "edits": [{"target": "old", "replacement": "new"}]}, "edit"),
            CallSpec("apply_patch", {"patch": PATCH}, "patch"),
            CallSpec("delete_file", {"path": "odd-mode.bin"}, "delete"),
            CallSpec("move_file", {"source": "moved.txt", "destination": "there.txt"}, "move"),
            CallSpec("shell", {"command": "touch ran.txt"}, "shell"),
        ]
        with daemon.client() as c:
            outcome = c.submit(calls, dry_run=True)
            by_id = {r.call_id: r for r in outcome.results}
            assert all(r.ok and r.data is not None and r.data["dry_run"] for r in outcome.results)
            assert "+hello" in by_id["write"].content
            assert "-old line" in by_id["edit"].content and "+new line" in by_id["edit"].content
            assert "-one" in by_id["patch"].content and "+uno" in by_id["patch"].content
            assert "would delete odd-mode.bin" in by_id["delete"].content
            assert "would move moved.txt to there.txt" in by_id["move"].content
            assert "not run in a dry run" in by_id["shell"].content
            assert by_id["shell"].data["policy"] == "allow" and by_id["write"].data["policy"] == "allow"
            journaled = c.get_batch(outcome.batch_id)
            assert all(r.data is not None and r.data["dry_run"] for r in journaled.results)
        cli = toolctl(daemon, "call", "write_file", "--args", '{"path": "cli.txt", "content": "x"}', "--dry-run")
        assert cli.returncode == 0 and "+x" in cli.stdout
        assert snapshot(root) == before and not (root / "ran.txt").exists() and not (root / "cli.txt").exists()
    finally:
        daemon.stop()


def test_a_dry_run_reports_what_the_policy_would_decide(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    config = '[[tools.approval.rules]]\ntool = "delete_file"\ndecision = "deny"\n'
    daemon = start_daemon(tmp_path, root, config=config)
    try:
        with daemon.client() as c:
            outcome = c.submit(
                [
                    CallSpec("delete_file", {"path": "a.txt"}),
                    CallSpec("write_file", {"path": "a.txt", "content": "b"}),
                    CallSpec("write_file", {"path": "b.txt", "content": "b"}),
                ],
                dry_run=True,
            )
        denied, exists, allowed = outcome.results
        assert not denied.ok and denied.data == {"dry_run": True, "policy": "deny"}
        assert not exists.ok and exists.data == {"dry_run": True, "policy": "error"}  # a planning failure
        assert allowed.ok and allowed.data is not None and allowed.data["policy"] == "allow"
        assert (root / "a.txt").read_text() == "a\n"
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("file_name", "dir_name"), [("f.txt", "d"), ("日" * 83 + ".txt", "é" * 127)], ids=["short", "255 bytes"]
)
def test_undo_puts_back_a_directory_the_batch_replaced_with_a_file(
    tmp_path: Path, file_name: str, dir_name: str
) -> None:
    """A path below what is now a file is not there (ENOTDIR, not "cannot be read"): the
    undo refused such a batch, "d/inner.txt changed since". And the names an undo gives
    what it sets aside, and its writes' temp files, are cut to fit by bytes: a multibyte
    name near the limit of 255 made them too long."""
    root = tmp_path / "root"
    root.mkdir()
    (root / file_name).write_text("before\n")
    (root / dir_name).mkdir()
    (root / dir_name / "inner.txt").write_text("inner\n")
    daemon = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with daemon.client() as c:
            calls = [
                CallSpec("read_file", {"path": file_name}),
                CallSpec("write_file", {"path": file_name, "content": "after\n", "overwrite": True}),
                CallSpec("delete_file", {"path": dir_name, "recursive": True}),
                CallSpec("write_file", {"path": dir_name, "content": "now a file\n"}),
            ]
            outcome = c.submit(calls, batch_id="replaced")
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
            undone = c.undo("replaced")
            assert all(r.ok for r in undone.results), [r.content for r in undone.results]
        assert (root / file_name).read_text() == "before\n"
        assert (root / dir_name / "inner.txt").read_text() == "inner\n"
        assert sorted(os.listdir(root)) == sorted([file_name, dir_name])
    finally:
        daemon.stop()
