"""Per-call temp dirs on the real filesystem: reused only when left exactly as given."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from toold_daemon.isolation.tempdirs import POOL_PER_UID, TempDirs

UID, GID = os.geteuid(), os.getegid()


@pytest.fixture
def temps() -> Iterator[TempDirs]:
    dirs = TempDirs(UID)
    try:
        yield dirs
    finally:
        dirs.close()


def test_an_untouched_dir_is_reused_and_private(temps: TempDirs) -> None:
    first = temps.take(UID, GID)
    assert os.stat(first).st_mode & 0o777 == 0o700
    assert os.stat(os.path.dirname(first)).st_mode & 0o777 == 0o700  # u<uid>: nobody else looks in
    temps.give_back(first, UID, reusable=True)
    assert temps.take(UID, GID) == first


@pytest.mark.parametrize("touch", ["file", "chmod", "not reusable"])
def test_a_touched_dir_is_removed_not_reused(temps: TempDirs, touch: str) -> None:
    first = temps.take(UID, GID)
    if touch == "file":
        Path(first, "left-behind").write_text("x")
    elif touch == "chmod":
        os.chmod(first, 0o777)  # what a careless command might do
    temps.give_back(first, UID, reusable=touch != "not reusable")
    assert not os.path.exists(first)
    second = temps.take(UID, GID)
    assert second != first and os.listdir(second) == []


def test_the_pool_is_bounded(temps: TempDirs) -> None:
    taken = [temps.take(UID, GID) for _ in range(POOL_PER_UID + 5)]
    for temp in taken:
        temps.give_back(temp, UID, reusable=True)
    assert sum(os.path.exists(t) for t in taken) == POOL_PER_UID
    assert len(os.listdir(temps.uid_base(UID, GID))) == POOL_PER_UID
