"""A path a call moves whole: taken with its contents while they fit, else by where it
went (nothing read); and the plan that moves it back only while no other call of the
batch touched it, where it went, or anything above or below either."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import pytest

from toold_daemon.records.stored_batches import StoredChange
from toold_daemon.undo import images, ledger


def _tree(top: Path, sizes: list[int]) -> None:
    (top / "sub").mkdir(parents=True)
    for i, size in enumerate(sizes):
        (top / "sub" / f"f{i}").write_bytes(b"x" * size)


def test_a_moved_tree_that_fits_is_taken_with_its_contents(tmp_path: Path) -> None:
    _tree(tmp_path / "a", [100, 200])
    moves = {tmp_path / "a": tmp_path / "b"}
    taken, used = images.capture([tmp_path / "a", tmp_path / "b"], 1000, lambda p: False, moves)
    assert used == 300
    assert [(image.kind, image.moved_to) for image in taken] == [
        ("dir", str(tmp_path / "b")),  # (an undo may still move it back)
        ("dir", ""),
        ("file", ""),
        ("file", ""),
        ("absent", ""),
    ]


def test_a_moved_tree_past_the_bound_is_one_image_of_where_it_went_and_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with open(tmp_path / "a" / "huge", "wb") as f:
        f.truncate(1 << 30)
    (tmp_path / "a" / "small").write_text("s")
    moves = {tmp_path / "a": tmp_path / "b"}
    tracemalloc.start()
    try:
        taken, used = images.capture([tmp_path / "a", tmp_path / "b"], 1 << 20, lambda p: False, moves)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20 and used == 0
    (moved, destination) = taken
    assert (moved.path, moved.kind, moved.moved_to, moved.note) == (
        str(tmp_path / "a"),
        "unknown",
        str(tmp_path / "b"),
        images.OVER_BOUND,
    )
    assert destination.kind == "absent"
    os.rename(tmp_path / "a", tmp_path / "b")
    after = images.changes_after(taken)
    assert [c.before.path for c in after] == [str(tmp_path / "a"), str(tmp_path / "b")]  # none per entry below


def test_a_moved_tree_holding_a_denied_or_unreadable_file_is_taken_by_where_it_went(tmp_path: Path) -> None:
    _tree(tmp_path / "a", [10])
    (tmp_path / "a" / "id.key").write_text("secret")
    os.mkfifo(tmp_path / "a" / "pipe")
    moves = {tmp_path / "a": tmp_path / "b"}

    def denied(path: str) -> bool:
        return path.endswith(".key")

    taken, used = images.capture([tmp_path / "a"], 1 << 20, denied, moves)
    assert [(image.kind, image.moved_to) for image in taken] == [("unknown", str(tmp_path / "b"))]
    assert "id.key" in taken[0].note and used == 0
    (tmp_path / "a" / "id.key").unlink()
    taken, used = images.capture([tmp_path / "a"], 1 << 20, denied, moves)
    assert [(image.kind, image.moved_to) for image in taken] == [("unknown", str(tmp_path / "b"))]
    assert "pipe" in taken[0].note


def _change(index: int, path: str, kind: str, after: str, moved_to: str = "") -> StoredChange:
    note = images.OVER_BOUND if moved_to else ""
    return StoredChange(index, path, kind, 0, "", note, after, "h" if after != "absent" else "", moved_to=moved_to)


MOVE = [_change(0, "/w/a", "unknown", "absent", moved_to="/w/n/b"), _change(0, "/w/n", "absent", "dir"),
        _change(0, "/w/n/b", "absent", "dir")]  # fmt: skip


def _moved_back(changes: list[StoredChange]) -> dict[str, str]:
    first: dict[str, StoredChange] = {}
    last: dict[str, StoredChange] = {}
    for change in changes:
        first.setdefault(change.path, change)
        last[change.path] = change
    return ledger._moved_back(changes, first, last, kept_too=True)


def test_a_tree_is_moved_back_only_while_nothing_else_of_the_batch_touched_it() -> None:
    assert _moved_back(MOVE) == {"/w/a": "/w/n/b"}
    # beside it, or above where it went: still moved back
    assert _moved_back([_change(0, "/w/ab", "absent", "file"), *MOVE, _change(2, "/w/n/c", "absent", "file")]) == {
        "/w/a": "/w/n/b"
    }
    for other in (
        _change(1, "/w/n/b/x", "absent", "file"),  # written into where it went
        _change(1, "/w/n/b", "dir", "absent"),  # where it went deleted
        _change(1, "/w/a", "absent", "file"),  # its old name made again
        _change(1, "/w/a/x", "absent", "file"),  # ... as a directory
        _change(1, "/w", "dir", "absent"),  # what holds it deleted
    ):
        assert _moved_back([*MOVE, other]) == {}, other
        # an earlier call that changed what was there before is no better
        earlier = StoredChange(-1, other.path, other.kind, 0, "", "", other.after_kind, other.after_hash)
        assert _moved_back([earlier, *MOVE]) == {}, earlier


def test_a_tree_moved_whole_is_known_after_by_what_its_entries_are_not_what_they_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashing the contents of a moved tree read every file: moving a directory of 18 GB
    ran past the call's time limit after the move, and the call said it failed."""
    _tree(tmp_path / "a", [10, 20])
    moves = {tmp_path / "a": tmp_path / "b"}
    taken, _ = images.capture([tmp_path / "a", tmp_path / "b"], 5, lambda p: False, moves)
    os.rename(tmp_path / "a", tmp_path / "b")
    looked_at: list[str] = []
    image_of = images.image_of

    def watched(path: str, **kwargs: Any) -> images.Image:
        looked_at.append(path)
        return image_of(path, **kwargs)

    monkeypatch.setattr(images, "image_of", watched)
    after = images.changes_after(taken)
    assert looked_at == [str(tmp_path / "a"), str(tmp_path / "b")]  # nothing below is read
    moved_there = after[1].after_hash
    assert moved_there.startswith(images.IDENTITY_TREE)

    def again() -> str:
        return images.state_and_mode_of(str(tmp_path / "b"), by_identity=True)[1]

    assert again() == moved_there
    os.rename(tmp_path / "b", tmp_path / "c")
    os.rename(tmp_path / "c", tmp_path / "b")
    assert again() == moved_there  # (moving the top changes no entry below it)
    time.sleep(0.02)  # (past the clock tick of its last change: ctime is that coarse)
    (tmp_path / "b/sub/f0").write_bytes(b"y" * 10)  # the same size, other bytes
    edited = again()
    assert edited != moved_there
    os.chmod(tmp_path / "b/sub/f1", 0o600)
    assert again() != edited


def test_within_one_call_a_file_moved_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture hashed a moved tree, and the state after the move hashed it twice more
    (the tree's hash, then each entry's): 40 MB moved took 940 ms, now 670."""
    _tree(tmp_path / "a", [10, 20, 30])
    hashed: list[int] = []
    digest = images.digest

    def counted(data: bytes) -> str:
        hashed.append(len(data))
        return digest(data)

    monkeypatch.setattr(images, "digest", counted)
    moves = {tmp_path / "a": tmp_path / "b"}
    with images.remembering_digests():
        taken, _ = images.capture([tmp_path / "a", tmp_path / "b"], 1000, lambda p: False, moves)
        assert sorted(hashed) == [10, 20, 30]
        os.rename(tmp_path / "a", tmp_path / "b")
        (tmp_path / "b/sub/f2").write_bytes(b"z" * 31)  # (changed: read again)
        after = images.changes_after(taken)
    assert sorted(hashed) == [10, 20, 30, 31]
    assert {c.before.path.rsplit("/", 1)[-1]: c.after_hash for c in after}["f0"] == digest(b"x" * 10)
    hashed.clear()
    images.changes_after(taken)  # outside a call nothing is remembered: each file read thrice
    assert len(hashed) == 9  # (the tree, its directory below, each file)


def test_a_restore_moving_back_from_a_path_it_does_not_name_is_refused_before_anything() -> None:
    """``restore_files`` moves back only from a path with an entry of its own (which the
    checks compare and the sandbox resolves like any other)."""
    from toold_daemon.errors import ToolError
    from toold_daemon.undo.restore import Entry, RestoreArgs, RestoreFiles

    stray = Entry(path="data", expect_kind="absent", kind="dir", moved_from="../elsewhere")
    with pytest.raises(ToolError) as refused:
        RestoreFiles().validate(RestoreArgs(undoes="b", entries=[stray]))
    assert refused.value.code == "BAD_ARGS" and "entry of its own" in refused.value.message
    named = Entry(path="moved", expect_kind="dir", kind="absent")
    known = msgspec.structs.replace(stray, moved_from="moved")
    RestoreFiles().validate(RestoreArgs(undoes="b", entries=[known, named]))  # (no error)
