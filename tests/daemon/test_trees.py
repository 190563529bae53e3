"""Walking and removing trees without recursion, with bounded descriptors."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.sandbox import trees

NAMES = st.sampled_from(["a", "b", "c", "d.txt", "e"])
PATHS = st.lists(st.lists(NAMES, min_size=1, max_size=4).map("/".join), max_size=12)


def _make(root: Path, paths: list[str]) -> None:
    for path in paths:
        target = root / path
        if target.exists() or any(parent.is_file() for parent in target.parents):
            continue
        if path.endswith(".txt"):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path)
        else:
            target.mkdir(parents=True, exist_ok=True)
    if (root / "a").is_dir() and not (root / "link").exists():
        os.symlink("a", root / "link")  # a symlink to a directory: listed, never entered


@settings(max_examples=60, deadline=None)
@given(PATHS)
def test_walk_visits_what_os_walk_visits_in_its_order(paths: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _make(root, paths)

        def both(walker: object) -> list[tuple[str, list[str], list[str]]]:
            seen = []
            for directory, dirs, files in walker:  # type: ignore[attr-defined]
                dirs.sort()
                seen.append((directory, list(dirs), sorted(files)))
            return seen

        assert both(trees.walk(tmp)) == both(os.walk(tmp, followlinks=False))


def test_a_tree_deeper_than_the_descriptors_it_may_hold_is_removed_whole(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("kept\n")
    fd = os.open(tmp_path, os.O_RDONLY)
    os.mkdir("doomed", dir_fd=fd)
    for level in range(5 * trees.MAX_OPEN):
        inner = os.open("doomed" if level == 0 else "d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(outside), "link", dir_fd=fd)  # removed as itself, never followed
    os.close(fd)
    open_before = len(os.listdir("/proc/self/fd"))
    trees.remove_tree(str(tmp_path / "doomed"))
    assert not (tmp_path / "doomed").exists()
    assert outside.read_text() == "kept\n"
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_what_cannot_be_removed_is_left_when_errors_are_ignored(tmp_path: Path) -> None:
    trees.remove_tree(str(tmp_path / "missing"), ignore_errors=True)  # nothing raised
    (tmp_path / "kept" / "inner").mkdir(parents=True)
    (tmp_path / "kept" / "inner" / "f").write_text("x")
    os.chmod(tmp_path / "kept" / "inner", 0o500)  # its entries cannot be removed (but by root)
    try:
        trees.remove_tree(str(tmp_path / "kept"), ignore_errors=True)
    finally:
        if (tmp_path / "kept" / "inner").exists():
            os.chmod(tmp_path / "kept" / "inner", 0o700)
    if os.geteuid() != 0:
        assert (tmp_path / "kept" / "inner" / "f").exists()
