"""Class Q: a directory tree nested a thousand levels deep takes nothing down.

Anyone who may make directories can nest them a thousand deep (``mkdir`` in a loop), and
Python 3.11's ``shutil.rmtree``, ``os.walk`` and ``os.fwalk`` call themselves once per
level. One command that left such a tree in its temporary directory made the daemon's
cleanup raise ``RecursionError``: the daemon went away for every client, and the next
start failed the same way on the tree left behind. In a workspace, such a tree made
``glob`` fail whole and ``move_file`` fail or time out.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon, start_daemon
from tests.deep_trees import nested, write_at
from toold_client import CallSpec

EVERYTHING = """
[tools.approval]
preset = "all"
"""
DEPTH = 1300


def _nest(directory: Path) -> None:
    """``directory``/a/a/.../a (``DEPTH`` levels) holding one file."""
    with nested(directory, "a", DEPTH) as bottom:
        write_at(bottom, "bottom.txt", "at the bottom\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "deep-trees", EVERYTHING) as d:
        try:
            yield d
        finally:  # pytest's own clean-up of old temp dirs recurses, as rmtree does
            subprocess.run(["rm", "-rf", str(d.root / "tree"), str(d.root / "moved")], check=False)


def test_a_command_that_leaves_a_deep_tree_in_its_temporary_directory_takes_nothing_down(
    daemon: DaemonProcess,
) -> None:
    nest = f'cd "$TMPDIR" && for i in $(seq {DEPTH}); do mkdir a && cd a || exit 1; done && echo nested'
    with daemon.client(timeout=60) as c:
        made = c.call("shell", {"command": nest}, timeout=60)
        assert made.ok and "nested" in made.content, made.content
        for _ in range(3):
            assert c.ping(timeout=5) < 5
            assert "still here" in c.call("shell", {"command": "echo still here"}, timeout=30).content
    assert daemon.proc.poll() is None, daemon.log.read_text()[-2000:]


def test_a_deep_tree_left_by_a_killed_daemon_does_not_keep_the_next_from_starting(tmp_path: Path) -> None:
    """A daemon killed with SIGKILL leaves its temporary directories; the next start
    removes those of daemons that are gone, a deep tree among them."""
    dead_pid = _a_pid_nobody_holds()
    stale = Path(tempfile.mkdtemp(prefix=f"toold-{os.geteuid()}-p{dead_pid}-", dir=tempfile.gettempdir()))
    _nest(stale)
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=EVERYTHING)
    try:
        with d.client(timeout=10) as c:
            assert c.ping(timeout=5) < 5
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", str(stale)], check=False)
    assert not stale.exists()


def _a_pid_nobody_holds() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        highest = int(f.read())
    for pid in range(highest - 1, 1, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    raise AssertionError("every pid is taken")


def test_tools_walk_move_delete_and_undo_a_deep_tree_in_the_workspace(daemon: DaemonProcess) -> None:
    (daemon.root / "tree").mkdir()
    _nest(daemon.root / "tree")
    with daemon.client(timeout=120) as c:
        found = c.call("glob", {"pattern": "**/*.txt", "path": "tree"}, timeout=60)
        assert found.ok and "not entered" in found.content, found.content
        moved = c.submit([CallSpec("move_file", {"source": "tree", "destination": "moved"})], timeout=60)
        assert moved.results[0].ok, moved.results[0].content
        # Its undo moves it back: one rename, whatever its depth (it named every path
        # below, 845,000 components to walk by name, and was refused).
        undone = c.undo(moved.batch_id, timeout=60).results[0]
        assert undone.ok, undone.content
        assert (daemon.root / "tree").is_dir() and not (daemon.root / "moved").exists()
        # A deleted tree's undo must make every path again: 1,300 paths of 1,300 levels. It
        # is refused as such, at once, and changes nothing.
        deleted = c.submit([CallSpec("delete_file", {"path": "tree", "recursive": True})], timeout=60)
        assert deleted.results[0].ok, deleted.results[0].content
        assert not (daemon.root / "tree").exists()
        undone = c.undo(deleted.batch_id, timeout=60).results[0]
        assert undone.ok or "path components" in undone.content, undone.content
    assert (daemon.root / "tree").exists() == undone.ok
