"""An undo that moves a tree back (from where the batch moved it, its contents not kept)
must never reach outside the roots through a symlink planted meanwhile: where the tree
went replaced by a link to outside, or a directory above it replaced so. The undo
refuses, or (forced) moves the link itself; nothing outside is moved, read or changed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.e2e.test_undo_trees import CONFIG, tree
from toold_client import CallSpec


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    config = CONFIG + "\n[journal]\nundo_max_bytes_per_batch = 1000\n"
    with module_daemon(tmp_path_factory, "moved-back-links", config) as d:
        yield d


@pytest.fixture
def outside() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="toold-outside-"))
    (top / "place/moved").mkdir(parents=True)
    (top / "place/moved/theirs.txt").write_text("not the workspace's\n")
    yield top
    shutil.rmtree(top)


def _moved(daemon: DaemonProcess, destination: str) -> str:
    root = daemon.root
    for entry in root.iterdir():
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    (root / "data").mkdir()
    (root / "data/big.bin").write_bytes(os.urandom(5000))  # past the bound: moved whole
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("move_file", {"source": "data", "destination": destination}, "m")])
    assert outcome.results[0].ok, outcome.results[0].content
    return outcome.batch_id


@pytest.mark.parametrize("force", [False, True])
def test_where_the_tree_went_replaced_by_a_link_to_outside(daemon: DaemonProcess, outside: Path, force: bool) -> None:
    batch = _moved(daemon, "moved")
    shutil.rmtree(daemon.root / "moved")
    (daemon.root / "moved").symlink_to(outside / "place/moved")
    before = tree(outside)
    with daemon.client(timeout=60) as c:
        (result,) = c.undo(batch, force=force).results
    assert tree(outside) == before
    if force:  # the link itself is what moves
        assert (daemon.root / "data").is_symlink() and not os.path.lexists(daemon.root / "moved")
    else:
        assert not result.ok and result.error is not None and result.error.code == "UNDO_CONFLICT", result.content
        assert (daemon.root / "moved").is_symlink() and not os.path.lexists(daemon.root / "data")


@pytest.mark.parametrize("force", [False, True])
def test_a_directory_above_where_it_went_replaced_by_a_link_to_outside(
    daemon: DaemonProcess, outside: Path, force: bool
) -> None:
    batch = _moved(daemon, "new/place/moved")
    shutil.rmtree(daemon.root / "new")
    (daemon.root / "new").symlink_to(outside)
    before = tree(outside)
    with daemon.client(timeout=60) as c:
        (result,) = c.undo(batch, force=force).results
    assert not result.ok, result.content
    assert tree(outside) == before and (outside / "place/moved/theirs.txt").exists()
    assert not os.path.lexists(daemon.root / "data")
