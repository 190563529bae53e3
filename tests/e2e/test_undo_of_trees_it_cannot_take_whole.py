"""A recursive delete of a tree the undo data cannot hold whole (a directory nested past
PATH_MAX: every name short, the whole path too long to read by path) is undone as far
as it can be, and the undo says what it could not put back. Before, the part it could
not read was dropped in silence: the undo put back the rest and called itself done."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.deep_trees import nested
from toold_client import CallSpec

EVERYTHING = """
[tools.approval]
preset = "all"
"""


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "not-whole", EVERYTHING) as d:
        try:
            yield d
        finally:
            subprocess.run(["rm", "-rf", str(d.root / "tree")], check=False)


def test_the_undo_of_a_tree_nested_past_path_max_says_it_is_not_whole(daemon: DaemonProcess) -> None:
    tree = daemon.root / "tree"
    tree.mkdir()
    (tree / "shallow.txt").write_text("kept\n")
    with nested(tree, "d" * 250, 20):
        pass
    with daemon.client(timeout=60) as c:
        deleted = c.submit([CallSpec("delete_file", {"path": "tree", "recursive": True})])
        assert deleted.results[0].ok, deleted.results[0].content
        assert "could not be read" in deleted.results[0].content, deleted.results[0].content
        assert not tree.exists()
        undone = c.undo(deleted.batch_id).results[0]
    assert undone.ok, undone.content
    assert "Not undoable: tree (" in undone.content and "could not be read" in undone.content, undone.content
    assert (tree / "shallow.txt").read_text() == "kept\n"


@pytest.mark.parametrize("what", ["one 5 GB file", "a directory of 5 GB"])
def test_files_larger_than_the_undo_bound_are_deleted_unread(daemon: DaemonProcess, what: str) -> None:
    """The pre-images of a delete were read whole before their size was weighed against
    the undo bound: deleting a 5 GB file (a log, a core dump) failed with MemoryError in
    the worker, and so did a directory holding more than a worker may hold. Files past
    the bound are now said not undoable, unread; what fits is still kept."""
    top = daemon.root / "tree"
    top.mkdir()
    (top / "small.txt").write_text("kept\n")
    sizes = [5 << 30] if what == "one 5 GB file" else [1 << 30] * 5
    for i, size in enumerate(sizes):
        with open(top / f"big{i}.bin", "wb") as f:
            f.truncate(size)  # sparse: nothing on disk
    with daemon.client(timeout=60) as c:
        deleted = c.submit([CallSpec("delete_file", {"path": "tree", "recursive": True})])
        (result,) = deleted.results
        assert result.ok, result.content
        assert "big0.bin (over the batch's undo bound)" in result.content
        assert not top.exists()
        (undone,) = c.undo(deleted.batch_id).results
    assert undone.ok, undone.content
    assert (top / "small.txt").read_text() == "kept\n" and not (top / "big0.bin").exists()


def test_a_moved_5_gb_file_is_moved_back_by_its_undo(daemon: DaemonProcess) -> None:
    """Moving a 5 GB file hashed it whole afterwards, and failed with MemoryError after
    the move (the call said it failed; nothing to undo it by). Its state is now its
    identity, and its contents are not kept: the undo moves it back (it was refused
    before, having no contents to put back)."""
    with open(daemon.root / "huge.log", "wb") as f:
        f.truncate(5 << 30)
    inode = (daemon.root / "huge.log").stat().st_ino
    try:
        with daemon.client(timeout=60) as c:
            moved = c.submit([CallSpec("move_file", {"source": "huge.log", "destination": "moved.log"})])
            assert moved.results[0].ok, moved.results[0].content
            (undone,) = c.undo(moved.batch_id).results
        assert undone.ok, undone.content
        assert (daemon.root / "huge.log").stat().st_ino == inode
        assert not (daemon.root / "moved.log").exists()
    finally:
        for name in ("huge.log", "moved.log"):
            (daemon.root / name).unlink(missing_ok=True)


def test_a_directory_of_18_gb_is_moved_and_moved_back_within_the_time_limit(daemon: DaemonProcess) -> None:
    """Its state after the move was the hash of every file in it: 18 GB read, past the
    call's 30 s, after the move was made; the call said it had failed and nothing was
    journaled to undo it by. Its undo, and the undo of that, are moves too. The files
    here are sparse: reading them costs no disk."""
    top = daemon.root / "dataset"
    top.mkdir()
    for i in range(300):
        with open(top / f"part{i}.bin", "wb") as f:
            f.truncate(60_000_000)
    try:
        with daemon.client(timeout=120) as c:
            moved = c.submit([CallSpec("move_file", {"source": "dataset", "destination": "archive/dataset"})])
            assert moved.results[0].ok, moved.results[0].content
            assert moved.results[0].duration_ms < 5_000
            undo = c.undo(moved.batch_id)
            assert undo.results[0].ok, undo.results[0].content
            assert len(list(top.iterdir())) == 300 and not (daemon.root / "archive").exists()
            (redone,) = c.undo(undo.batch_id).results  # the undo's own undo moves it again
        assert redone.ok and redone.duration_ms < 5_000, redone.content
        assert len(list((daemon.root / "archive/dataset").iterdir())) == 300 and not top.exists()
    finally:
        subprocess.run(["rm", "-rf", str(top), str(daemon.root / "archive")], check=False)
