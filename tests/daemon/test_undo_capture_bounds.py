"""A tree whose entries are not all taken before a call changes it (past the bound, or
below a directory that cannot be read) is marked so at its top: the undo then says
which tree it could not put back whole, rather than put back part and call it done."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deep_trees import nested
from toold_daemon.undo import images


def _capture(path: Path) -> list[images.Image]:
    taken, _ = images.capture([path], 1 << 20, lambda p: False)
    return taken


def test_a_tree_past_the_bound_is_marked_at_its_top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "MAX_ENTRIES", 5)
    for i in range(8):
        (tmp_path / "t" / "sub").mkdir(parents=True, exist_ok=True)
        (tmp_path / "t" / "sub" / f"f{i}").write_text(str(i))
    taken = _capture(tmp_path / "t")
    top = (str(tmp_path / "t"), "unknown", "more than 5 entries below")
    assert (taken[0].path, taken[0].kind, taken[0].note) == top
    assert [i.kind for i in taken[1:]] == ["dir", "file", "file", "file"]  # what was taken is still kept


def test_a_tree_with_a_directory_past_path_max_is_marked_at_its_top(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "shallow.txt").write_text("kept\n")
    with nested(tmp_path / "t", "d" * 250, 20):
        pass
    taken = _capture(tmp_path / "t")
    assert taken[0].kind == "unknown" and "could not be read" in taken[0].note, taken[0]
    assert "File name too long" in taken[0].note
    assert any(i.path.endswith("shallow.txt") and i.kind == "file" for i in taken)
