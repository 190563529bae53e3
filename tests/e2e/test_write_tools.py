"""The mutating tools through a real daemon: isolated children, session read tracking,
the default policy's dynamic approval."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, start_daemon

ALLOW_EDITS = """
[tools.approval]
allowlist = ["edit_file", "apply_patch", "delete_file", "move_file"]
"""


@pytest.fixture
def daemon(tmp_path: Path, root: Path) -> Iterator[DaemonProcess]:
    d = start_daemon(tmp_path, root, config=ALLOW_EDITS)
    try:
        yield d
    finally:
        d.stop()


def test_stale_file_when_another_process_changes_it_between_read_and_patch(daemon: DaemonProcess) -> None:
    target = daemon.root / "app.py"
    target.write_text("x = 1\n")
    patch = "LP1\nF app.py\nR\nx = 1\n.\nx = 2\n.\nEND\n"
    with daemon.client(timeout=30) as client:
        assert client.call("read_file", {"path": "app.py"}).ok
        subprocess.run([sys.executable, "-c", f"open({str(target)!r}, 'a').write('y = 0\\n')"], check=True)
        stale = client.call("apply_patch", {"patch": patch})
        assert stale.error is not None and stale.error.type == "StaleFile" and "changed since" in stale.content
        assert target.read_text() == "x = 1\ny = 0\n"
        assert client.call("read_file", {"path": "app.py"}).ok
        done = client.call("apply_patch", {"patch": patch})
        assert done.ok, done.content
    assert target.read_text() == "x = 2\ny = 0\n"


def test_reads_are_per_session(daemon: DaemonProcess) -> None:
    (daemon.root / "f.txt").write_text("a\n")
    edit = {"path": "f.txt", "edits": [{"target": "a", "replacement": "b"}]}
    with daemon.client(timeout=30) as reader:
        assert reader.call("read_file", {"path": "f.txt"}).ok
        with daemon.client(timeout=30) as other:
            refused = other.call("edit_file", edit)
            assert refused.error is not None and "not been read" in refused.content
        assert reader.call("edit_file", edit).ok
    assert (daemon.root / "f.txt").read_text() == "b\n"


def test_a_read_and_an_edit_in_one_batch(daemon: DaemonProcess) -> None:
    (daemon.root / "f.txt").write_text("hello\n")
    with daemon.client(timeout=30) as client:
        outcome = client.submit(
            [
                {"name": "read_file", "arguments": {"path": "f.txt"}},
                {"name": "edit", "arguments": {"path": "f.txt", "edits": [{"target": "hello", "replacement": "bye"}]}},
                {"name": "move_file", "arguments": {"source": "f.txt", "destination": "g/f.txt"}},
                {"name": "delete_file", "arguments": {"path": "g", "recursive": True}},
            ]
        )
    assert [r.ok for r in outcome.results] == [True] * 4, [r.content for r in outcome.results]
    assert "-hello" in (outcome.results[1].display or "")
    assert not (daemon.root / "g").exists()


def test_default_policy_creates_without_asking_but_asks_to_overwrite(tmp_path: Path, root: Path) -> None:
    from toold_client import DENY_ALL

    asked: list[str] = []

    def deny(request: object) -> object:
        asked.extend(item.name for item in request.calls)  # type: ignore[attr-defined]
        return DENY_ALL

    d = start_daemon(tmp_path, root)
    try:
        with d.client(timeout=30) as client:
            created = client.call("write_file", {"path": "new.txt", "content": "1"}, on_confirm=deny)  # type: ignore[arg-type]
            overwrite = client.call(
                "write_file",
                {"path": "new.txt", "content": "2", "overwrite": True},
                on_confirm=deny,  # type: ignore[arg-type]
            )
            delete = client.call("delete_file", {"path": "new.txt"}, on_confirm=deny)  # type: ignore[arg-type]
    finally:
        d.stop()
    assert created.ok, created.content
    assert asked == ["write_file", "delete_file"]
    assert overwrite.error is not None and overwrite.error.code == "DENIED_BY_USER"
    assert delete.error is not None and delete.error.code == "DENIED_BY_USER"
    assert (root / "new.txt").read_text() == "1"
