"""A workspace on a FAT disk (a USB stick, a card): a real FAT image through FUSE.

Such a disk keeps no modes (``fchmod`` fails: EPERM from the kernel's vfat, ENOSYS from
FUSE), no hard links, no unnamed files, and folds case. Every file tool must work there,
and undo must put everything back; before, each write to an existing file, and each
undo, failed "Function not implemented".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.folding_disk import fat_disk
from toold_client import CallSpec

EVERYTHING = """
[tools.approval]
preset = "all"
"""


@pytest.fixture(scope="module")
def fat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("fat-workspace")
    with fat_disk(base) as disk:
        (base / "daemon").mkdir()
        daemon = start_daemon(base / "daemon", disk, config=EVERYTHING)
        try:
            yield daemon
        finally:
            daemon.stop()


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_file_tool_works_and_undo_puts_it_all_back(fat: DaemonProcess) -> None:
    root = fat.root / "all-tools"
    root.mkdir()
    (root / "keep.txt").write_text("one\ntwo\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "old-name.txt").write_text("moved\n")
    before = _tree(root)
    calls = [
        CallSpec("write_file", {"path": "all-tools/keep.txt", "content": "one\n2\n", "overwrite": True}),
        CallSpec("edit_file", {"path": "all-tools/keep.txt", "edits": [{"target": "one", "replacement": "1"}]}),
        CallSpec(
            "apply_patch",
            {
                "patch": "*** Begin Patch\n*** Update File: all-tools/keep.txt\n@@\n 1\n-2\n+two\n"
                "*** Add File: all-tools/deep/new.txt\n+new\n*** End Patch\n"
            },
        ),
        CallSpec("delete_file", {"path": "all-tools/gone.txt"}),
        CallSpec("move_file", {"source": "all-tools/old-name.txt", "destination": "all-tools/new-name.txt"}),
    ]
    with fat.client(timeout=30) as c:
        done = c.submit(calls)
        assert [r.ok for r in done.results] == [True] * len(calls), [r.content for r in done.results]
        assert _tree(root) == {
            "keep.txt": "1\ntwo\n",
            "deep/new.txt": "new\n",
            "new-name.txt": "moved\n",
        }
        undone = c.undo(done.batch_id)
    assert undone.results[0].ok, undone.results[0].content
    assert _tree(root) == before


def test_a_name_in_another_case_is_the_same_file(fat: DaemonProcess) -> None:
    """The disk folds case: writing ``CASE.TXT`` finds ``case.txt`` there, and renaming
    a file to another case of its own name keeps its content (not a move over itself),
    as does undoing that."""
    (fat.root / "case.txt").write_text("original\n")
    with fat.client(timeout=30) as c:
        refused = c.call("write_file", {"path": "CASE.TXT", "content": "other\n"})
        assert not refused.ok and refused.error is not None and refused.error.code == "FILE_EXISTS", refused
        moved = c.submit([CallSpec("move_file", {"source": "case.txt", "destination": "Case.txt", "overwrite": True})])
        assert moved.results[0].ok, moved.results[0].content
        assert [p.name for p in fat.root.iterdir() if p.name.lower() == "case.txt"] == ["Case.txt"]
        assert (fat.root / "Case.txt").read_text() == "original\n"
        undone = c.undo(moved.batch_id)
    assert undone.results[0].ok, undone.results[0].content
    # The content is back; the name's case is the one the disk kept (fusefat keeps the
    # entry's, and the undo's last step removes nothing the restore just wrote).
    assert [p.read_text() for p in fat.root.iterdir() if p.name.lower() == "case.txt"] == ["original\n"]


def test_commands_and_searches_run_there(fat: DaemonProcess) -> None:
    with fat.client(timeout=30) as c:
        ran = c.call("shell", {"command": "mkdir -p cmd && echo made > cmd/out.txt && cat cmd/out.txt"})
        found = c.call("grep", {"pattern": "made", "path": "cmd"})
    assert ran.ok and "made" in ran.content, ran.content
    assert "cmd/out.txt" in found.content, found.content
