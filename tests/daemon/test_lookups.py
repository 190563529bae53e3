"""Lookups on the event loop come from the kernel's caches, or say they would wait."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.folding_disk import fat_disk
from toold_daemon.sandbox.lookups import WouldBlock, from_the_caches_alone, lexists, open_path
from toold_daemon.sandbox.paths import Sandbox


def test_a_cached_path_is_looked_up_on_the_loop(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("x")
    with from_the_caches_alone():
        os.close(open_path(str(tmp_path / "a" / "f.txt")))
        assert lexists(str(tmp_path / "a" / "f.txt"))
        assert Sandbox([tmp_path]).canonical(str(tmp_path / "a" / "f.txt")) == str(tmp_path / "a" / "f.txt")


def test_a_name_never_looked_up_on_a_local_disk_is_looked_up_there(tmp_path: Path) -> None:
    """A new file's name, a command's word: the kernel has no entry for it yet, and one
    real lookup in a cached directory of a local disk answers (no thread needed)."""
    (tmp_path / "a").mkdir()
    sandbox = Sandbox([tmp_path])
    name = f"never-looked-up-{os.getpid()}-{time.monotonic_ns()}"
    with from_the_caches_alone():
        with pytest.raises(WouldBlock):
            open_path(str(tmp_path / "a" / name))  # the cache alone cannot say
        assert sandbox.canonical(str(tmp_path / "a" / name)) == str(tmp_path / "a" / name)


def test_a_path_the_kernel_must_ask_a_disk_about_would_block_on_the_loop(tmp_path: Path) -> None:
    """A FUSE disk's answers expire from the kernel's caches after a second: then only
    the disk can answer, and on the loop the lookup declines instead of waiting."""
    with fat_disk(tmp_path) as disk:
        (disk / "f.txt").write_text("x")
        on_disk, around_disk = Sandbox([disk]), Sandbox([tmp_path])  # a FUSE root; a mount below a local one
        time.sleep(2.5)
        for sandbox in (on_disk, around_disk):
            with from_the_caches_alone(), pytest.raises(WouldBlock):
                sandbox.canonical(str(disk / "f.txt"))
        with from_the_caches_alone(), pytest.raises(WouldBlock):
            lexists(str(disk / "f.txt"))
        assert on_disk.canonical(str(disk / "f.txt")) == str(disk / "f.txt")  # off the loop: it asks the disk
        with from_the_caches_alone():
            assert lexists(str(disk / "f.txt"))  # and now the answer is cached
