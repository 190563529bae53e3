"""Paths past PATH_MAX are opened in pieces; short ones are passed through untouched."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.deep_trees import nested, write_at
from toold_daemon.sandbox import long_paths


def _deep_file(root: Path, depth: int, name: str = "n" * 200) -> str:
    with nested(root, name, depth) as bottom:
        write_at(bottom, "leaf.txt", "leaf\n", 0o600)
    return "/".join([str(root), *[name] * depth, "leaf.txt"])


def test_a_path_past_path_max_is_opened_statted_and_reached_in_pieces(tmp_path: Path) -> None:
    path = _deep_file(tmp_path, 45)  # ~9 KB
    assert len(os.fsencode(path)) > 2 * long_paths.PIECE_BYTES
    with pytest.raises(OSError) as whole:
        os.stat(path)
    assert whole.value.errno == errno.ENAMETOOLONG
    assert long_paths.too_long(path)
    fd = long_paths.open_in_pieces(path, os.O_RDONLY)
    try:
        assert os.read(fd, 100) == b"leaf\n"
        assert long_paths.lstat(path).st_ino == os.fstat(fd).st_ino
        with long_paths.reachable(path) as target:
            assert target.startswith("/proc/self/fd/")
            assert os.stat(target).st_ino == os.fstat(fd).st_ino
    finally:
        os.close(fd)


def test_a_short_path_is_used_as_it_is(tmp_path: Path) -> None:
    path = _deep_file(tmp_path, 2)
    assert not long_paths.too_long(path)
    with long_paths.reachable(path) as target:
        assert target == path
    assert long_paths.lstat(path).st_size == 5


def test_a_directory_on_the_way_swapped_for_a_symlink_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    path = _deep_file(tmp_path / "real", 30)
    middle = tmp_path / "real" / ("n" * 200) / ("n" * 200)  # any directory on the way
    os.rename(middle, str(middle) + ".moved")
    os.symlink(os.path.basename(middle) + ".moved", middle)  # the same tree, through a symlink
    with pytest.raises(OSError) as refused:
        long_paths.open_in_pieces(path, os.O_RDONLY)
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
