"""A path moved whole whose contents the batch could not keep (a tree larger than the
undo bound, one holding a denied file) is undone by moving it back. Before, such a move
could not be undone at all: the undo refused (or, before that, put back the part it
had bytes for and destroyed the rest). Moving back must never lose a file: when the
batch changed the tree again after moving it, the undo still refuses, and a step that
fails after a tree was moved back moves it where the batch left it again."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.e2e.test_undo_trees import CONFIG, tree
from toold_client import CallSpec

BOUND = 100_000  # room for 3 of the 8 parts below


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    config = CONFIG + f"\n[journal]\nundo_max_bytes_per_batch = {BOUND}\n"
    with module_daemon(tmp_path_factory, "moves-back", config) as d:
        yield d


@pytest.fixture
def root(daemon: DaemonProcess) -> Iterator[Path]:
    root = daemon.root
    (root / "data/sub").mkdir(parents=True)
    for i in range(8):
        (root / "data" / f"part{i}.bin").write_bytes(os.urandom(30_000))
    (root / "data/sub/notes.txt").write_text("notes\n")
    os.chmod(root / "data/sub", 0o750)
    (root / "data/link").symlink_to("sub/notes.txt")
    yield root
    for entry in root.iterdir():
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def test_a_tree_larger_than_the_undo_bound_is_moved_back(daemon: DaemonProcess, root: Path) -> None:
    before = tree(root)
    inode = (root / "data/part0.bin").stat().st_ino
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("move_file", {"source": "data", "destination": "new/place/moved"}, "m")])
        (moved,) = outcome.results
        assert moved.ok and "not undoable" not in moved.content, moved.content
        after = tree(root)
        undo = c.undo(outcome.batch_id)
        assert undo.results[0].ok, undo.results[0].content
        assert tree(root) == before  # the made directories are gone too
        assert (root / "data/part0.bin").stat().st_ino == inode  # moved, never copied through the undo store
        (redone,) = c.undo(undo.batch_id).results  # and the undo's undo moves it again
    assert redone.ok, redone.content
    assert tree(root) == after and (root / "new/place/moved/part0.bin").stat().st_ino == inode


def test_a_tree_holding_a_denied_file_is_moved_back(daemon: DaemonProcess, root: Path) -> None:
    """A denied file's bytes never leave the workspace, so such a tree's contents are
    not kept whole: its undo was refused (it could put back all but the secret)."""
    (root / "data/id.key").write_text("secret\n")
    for i in range(1, 8):
        (root / "data" / f"part{i}.bin").unlink()  # (well within the bound)
    before = tree(root)
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("move_file", {"source": "data", "destination": "moved"}, "m")])
        assert outcome.results[0].ok, outcome.results[0].content
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == before


def test_a_moved_tree_the_batch_changed_again_is_not_moved_back(daemon: DaemonProcess, root: Path) -> None:
    """Written into after the move, the tree is no longer what the move left, and its
    contents were not kept: the undo refuses, changing nothing, as it would have to take
    away the only copy of the files it cannot put back. (Putting back the part it had
    bytes for, an undo once destroyed the rest.)"""
    with daemon.client(timeout=60) as c:
        calls = [
            CallSpec("move_file", {"source": "data", "destination": "moved"}, "m"),
            CallSpec("write_file", {"path": "moved/added.txt", "content": "added\n"}, "w"),
        ]
        outcome = c.submit(calls)
        assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
        after = tree(root)
        (result,) = c.undo(outcome.batch_id).results
    assert not result.ok and result.error is not None and result.error.code == "UNDO_INCOMPLETE", result.content
    assert "changed again by the batch" in result.content, result.content
    assert tree(root) == after


def test_a_moved_tree_changed_since_is_a_conflict_and_forcing_keeps_the_change(
    daemon: DaemonProcess, root: Path
) -> None:
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("move_file", {"source": "data", "destination": "moved"}, "m")])
        assert outcome.results[0].ok
        (root / "moved/sub/notes.txt").write_text("edited since\n")
        after = tree(root)
        (refused,) = c.undo(outcome.batch_id).results
        assert not refused.ok and refused.error is not None and refused.error.code == "UNDO_CONFLICT"
        assert tree(root) == after
        (forced,) = c.undo(outcome.batch_id, force=True).results
    assert forced.ok, forced.content
    assert (root / "data/sub/notes.txt").read_text() == "edited since\n"  # moved back, edit and all
    assert not (root / "moved").exists()


def test_a_tree_moved_back_goes_where_the_batch_left_it_when_a_later_step_fails(
    daemon: DaemonProcess, root: Path
) -> None:
    (root / "kept.txt").write_text("original\n")
    with daemon.client(timeout=60) as c:
        calls = [
            CallSpec("move_file", {"source": "data", "destination": "moved"}, "m"),
            CallSpec("write_file", {"path": "kept.txt", "content": "changed\n", "overwrite": True}, "o"),
        ]
        outcome = c.submit(calls)
        assert all(r.ok for r in outcome.results)
        for blob in (root.parent / "state").rglob("*"):
            if blob.is_file() and blob.read_bytes() == b"original\n":
                blob.unlink()  # the pre-image of kept.txt is lost: its step fails
        after = tree(root)
        (result,) = c.undo(outcome.batch_id).results
    assert not result.ok and result.error is not None and result.error.code == "UNDO_FAILED", result.content
    assert "nothing was changed" in result.content, result.content
    assert tree(root) == after


def test_a_tree_within_the_bound_is_moved_back_too_the_same_files(daemon: DaemonProcess, root: Path) -> None:
    """Its contents were kept, but making it again from them wrote every file anew: other
    inodes, a hard link split in two, times of the undo. A move back is exact."""
    for i in range(1, 8):
        (root / "data" / f"part{i}.bin").unlink()
    os.link(root / "data/part0.bin", root / "data/sub/same.bin")
    before = tree(root)
    stats = {p: p.stat() for p in (root / "data/part0.bin", root / "data/sub/notes.txt")}
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("move_file", {"source": "data", "destination": "moved"}, "m")])
        assert outcome.results[0].ok
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == before
    for path, st in stats.items():
        now = path.stat()
        assert (now.st_ino, now.st_nlink, now.st_mtime_ns) == (st.st_ino, st.st_nlink, st.st_mtime_ns), path


def test_a_tree_within_the_bound_changed_again_by_the_batch_is_made_again_from_its_contents(
    daemon: DaemonProcess, root: Path
) -> None:
    for i in range(1, 8):
        (root / "data" / f"part{i}.bin").unlink()
    before = tree(root)
    with daemon.client(timeout=60) as c:
        calls = [
            CallSpec("move_file", {"source": "data", "destination": "moved"}, "m"),
            CallSpec("write_file", {"path": "moved/sub/notes.txt", "content": "new\n", "overwrite": True}, "w"),
            CallSpec("write_file", {"path": "data/other.txt", "content": "other\n"}, "o"),
        ]
        outcome = c.submit(calls)
        assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == before
