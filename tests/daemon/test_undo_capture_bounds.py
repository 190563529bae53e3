"""A tree whose entries are not all taken before a call changes it (past the bound, or
below a directory that cannot be read) is marked so at its top: the undo then says
which tree it could not put back whole, rather than put back part and call it done."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deep_trees import nested
from toold_daemon.config import Config
from toold_daemon.sandbox import Sandbox
from toold_daemon.tools import ToolContext
from toold_daemon.undo import images
from toold_daemon.undo.rollback import Rollback


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


def test_a_large_file_is_known_by_its_identity_and_never_read_whole(tmp_path: Path) -> None:
    """States compared (after a call, in a tree's hash) hash a file's contents up to
    64 MiB; past that, its inode, size and times stand for them, and nothing is read
    (moving a 5 GB file failed with MemoryError hashing it). A change to it changes its
    identity, as a change to a small file changes its hash."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(images.HASHED_MAX_BYTES + 1)
    kind, identity = images.state_of(str(big))
    assert kind == "file" and identity.startswith("stat:")
    assert images.state_of(str(big)) == (kind, identity)  # the same while untouched
    with open(big, "r+b") as f:
        f.write(b"changed")
    assert images.state_of(str(big))[1] != identity
    assert images.tree_digest(str(tmp_path))  # (a tree holding it is hashed without reading it)


def test_a_rollback_keeps_a_large_file_by_a_second_name(tmp_path: Path) -> None:
    """An undo remembers each path it touches, to put it back should a later step fail:
    a large file by a second name beside it (read into memory, a 5 GB one failed), which
    a rollback renames back and a completed undo removes."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(images.HASHED_MAX_BYTES + 1)
    inode = big.stat().st_ino
    ctx = ToolContext(call_id="undo", sandbox=Sandbox([tmp_path]), config=Config())
    for outcome in ("failed", "done"):
        undo = Rollback(ctx, f"t{outcome}")
        undo.remember("big.bin")
        assert not undo.before and len(undo.linked) == 1  # nothing held in memory
        big.unlink()  # the step: the undo takes it away
        if outcome == "failed":
            assert undo.back() == []
            assert big.stat().st_ino == inode  # the same file, back at its name
        else:
            undo.commit()
            assert not big.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == (["big.bin"] if outcome == "failed" else [])
