"""Finishing an undo a crash cut short (``restore_files`` with ``resume``), on real files:
the undo takes away what the batch made deepest first, so a directory the batch made can
be found with its contents already gone and itself still there. That is the undo midway,
not someone's change; a file nobody planned for inside it still is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from toold_daemon.config import Config
from toold_daemon.errors import ToolError
from toold_daemon.sandbox import Sandbox
from toold_daemon.tools import ToolContext
from toold_daemon.undo.images import state_of
from toold_daemon.undo.restore import Entry, RestoreArgs, RestoreFiles

MADE = ["made", "made/deep", "made/deep/new.txt", "moved", "moved/tree", "moved/tree/inner", "moved/tree/inner/x.txt"]


def after_the_batch(root: Path) -> list[Entry]:
    """The batch made these; the undo's plan takes them away, deepest first."""
    (root / "made/deep").mkdir(parents=True)
    (root / "made/deep/new.txt").write_text("n\n")
    (root / "moved/tree/inner").mkdir(parents=True)
    (root / "moved/tree/inner/x.txt").write_text("x\n")
    entries = []
    for path in sorted(MADE, key=lambda p: p.count("/"), reverse=True):
        kind, digest = state_of(str(root / path))
        entries.append(Entry(path=path, expect_kind=kind, kind="absent", expect_hash=digest))
    return entries


def resume(root: Path, entries: list[Entry]) -> str:
    ctx = ToolContext(call_id="undo", sandbox=Sandbox([root]), config=Config())
    return RestoreFiles().run(RestoreArgs(undoes="b1", entries=entries, resume=True), ctx).content


def test_directories_emptied_by_the_cut_short_undo_are_taken_away_when_it_resumes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    entries = after_the_batch(root)
    # the undo before the crash: the deepest entries were gone, their directories not yet
    os.unlink(root / "moved/tree/inner/x.txt")
    os.rmdir(root / "moved/tree/inner")
    os.unlink(root / "made/deep/new.txt")
    content = resume(root, entries)
    assert "after the daemon restarted" in content
    assert sorted(os.listdir(root)) == []


def test_a_file_nobody_planned_for_in_such_a_directory_is_still_a_conflict(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    entries = after_the_batch(root)
    shutil.rmtree(root / "moved/tree/inner")
    (root / "moved/tree/theirs.txt").write_text("someone else's\n")
    with pytest.raises(ToolError) as refused:
        resume(root, entries)
    assert refused.value.code == "UNDO_CONFLICT" and "moved/tree" in refused.value.message
    assert (root / "moved/tree/theirs.txt").read_text() == "someone else's\n"


@pytest.mark.parametrize("moved_back_before_the_crash", [True, False])
def test_a_tree_moved_back_is_found_moved_back_or_moved_when_it_resumes(
    tmp_path: Path, moved_back_before_the_crash: bool
) -> None:
    """An undo moves a tree back first (from where the batch moved it, without keeping its
    contents), then takes away the directory the move made for it. Cut short after the
    move back, the tree is where it belongs and that directory still there; before it,
    the tree is still where the batch left it. Either way it resumes to the end."""
    root = tmp_path / "root"
    (root / "new/place/tree/inner").mkdir(parents=True)
    (root / "new/place/tree/inner/x.txt").write_text("x\n")
    entries = [
        Entry(path="data", expect_kind="absent", kind="dir", moved_from="new/place/tree"),
        *[
            Entry(path=path, expect_kind="dir", kind="absent", expect_hash=state_of(str(root / path))[1])
            for path in ("new/place/tree", "new/place", "new")
        ],
    ]
    if moved_back_before_the_crash:
        os.rename(root / "new/place/tree", root / "data")
    content = resume(root, entries)
    assert "after the daemon restarted" in content
    assert sorted(os.listdir(root)) == ["data"] and (root / "data/inner/x.txt").read_text() == "x\n"
