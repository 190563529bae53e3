"""Q. A full workspace disk never half-applies a patch. Attack: another local user (or
anything else on the machine) fills the filesystem the workspace is on, here a real
tmpfs of 200 KB, so that a patch's third file finds no room: the first file was left
changed and the second created, though a patch is all files or none. Every new content
is now staged before any file changes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import small_tmpfs
from tests.daemon.test_write_tools import Workspace, read_then


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", "size=200k") as disk:
        yield disk


def test_a_patch_the_disk_has_no_room_for_changes_nothing(small_disk: Path) -> None:
    """Every file's new content is staged before any is put in place: the disk filling up
    on the third file left the first changed and the second created (all or none, said
    the tool)."""
    ws = Workspace(small_disk)
    for name in ("f1.txt", "f2.txt"):
        (small_disk / name).write_text(f"{name}\n")
        read_then(ws, name)
    free = shutil.disk_usage(small_disk).free
    patch = (
        "*** Begin Patch\n*** Update File: f1.txt\n@@\n-f1.txt\n+F1\n*** Add File: big.txt\n+"
        + "x" * (free // 2)
        + "\n*** Update File: f2.txt\n@@\n-f2.txt\n+"
        + "y" * (free // 2)
        + "\n*** End Patch\n"
    )
    error = ws.error("apply_patch", patch=patch)
    assert "No space left on device" in error.message and error.details["path"] == "f2.txt", error.message
    assert sorted(os.listdir(small_disk)) == ["f1.txt", "f2.txt"]  # nothing created, no temp file left
    assert [(small_disk / n).read_text() for n in ("f1.txt", "f2.txt")] == ["f1.txt\n", "f2.txt\n"]
    assert shutil.disk_usage(small_disk).free == free


def test_a_write_the_disk_has_no_room_for_leaves_no_directory_it_made(small_disk: Path) -> None:
    """The directories made for a new file are removed again when its write fails; a
    failed patch or write_file left them behind, empty."""
    ws = Workspace(small_disk)
    free = shutil.disk_usage(small_disk).free
    patch = (
        "*** Begin Patch\n*** Add File: new/deeper/small.txt\n+small\n*** Add File: big.txt\n+"
        + "x" * (free + 4096)
        + "\n*** End Patch\n"
    )
    assert "No space left on device" in ws.error("apply_patch", patch=patch).message
    error = ws.error("write_file", path="made/for/it.txt", content="y" * (free + 4096), create_dirs=True)
    assert "No space left on device" in error.message
    assert os.listdir(small_disk) == []
    (small_disk / "kept").mkdir()  # a directory that was there stays
    ws.error("write_file", path="kept/sub/it.txt", content="y" * (free + 4096), create_dirs=True)
    assert sorted(p.name for p in small_disk.rglob("*")) == ["kept"]
