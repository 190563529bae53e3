"""Reading an opened file whole, up to a limit, in reads of the size it has."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from toold_daemon.sandbox.reads import read_at_most


@contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("length", [0, 1, 4096, 65_537, 300_000])
def test_reads_the_whole_file_under_the_limit(tmp_path: Path, length: int) -> None:
    data = os.urandom(length)
    (tmp_path / "f").write_bytes(data)
    with opened(tmp_path / "f") as fd:
        assert read_at_most(fd, 1 << 20, os.fstat(fd).st_size) == data


@pytest.mark.parametrize("limit", [1, 4095, 4096, 4097])
def test_stops_at_the_limit(tmp_path: Path, limit: int) -> None:
    data = os.urandom(4096)
    (tmp_path / "f").write_bytes(data)
    with opened(tmp_path / "f") as fd:
        assert read_at_most(fd, limit, len(data)) == data[:limit]


@pytest.mark.parametrize("told", [0, 10, 100_000])
def test_a_file_that_is_not_the_size_it_was_told_is_read_to_its_end(tmp_path: Path, told: int) -> None:
    """The size only shapes the first read: a file that grew (or shrank) after ``fstat``
    is read to its end all the same, in further reads."""
    data = os.urandom(200_000)
    (tmp_path / "f").write_bytes(data)
    with opened(tmp_path / "f") as fd:
        assert read_at_most(fd, 1 << 20, told) == data
        assert read_at_most(fd, 1 << 20, told) == b""  # from the offset: nothing left


def test_a_file_growing_while_it_is_read_is_cut_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    stop = threading.Event()

    def grow() -> None:
        with path.open("ab") as f:
            while not stop.is_set():
                f.write(b"y" * 65536)
                f.flush()

    writer = threading.Thread(target=grow)
    writer.start()
    try:
        with opened(path) as fd:
            read = read_at_most(fd, 5_000_000, 1000)
    finally:
        stop.set()
        writer.join()
    assert read.startswith(b"x" * 1000)
    assert len(read) <= 5_000_000


def test_a_pipe_is_read_to_its_end(tmp_path: Path) -> None:
    """Short reads (a pipe gives what was written so far) do not end the read early."""
    read_end, write_end = os.pipe()

    def write() -> None:
        for _ in range(5):
            os.write(write_end, b"z" * 10_000)
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_at_most(read_end, 1 << 20, 0) == b"z" * 50_000
    finally:
        writer.join()
        os.close(read_end)


@pytest.mark.parametrize("length", [1, 4096, 200_000])
def test_a_file_of_the_size_it_was_told_takes_one_read(tmp_path: Path, length: int, reads: list[int]) -> None:
    """The first read asks for a byte more than the size: getting exactly the size is the
    end, seen without another read (one system call fewer for every file read whole)."""
    data = os.urandom(length)
    (tmp_path / "f").write_bytes(data)
    with opened(tmp_path / "f") as fd:
        assert read_at_most(fd, 1 << 20, length) == data
    assert reads == [length + 1]


def test_a_pipe_whose_first_read_gives_the_size_it_was_told_is_still_read_to_its_end() -> None:
    """Only a regular file's short read is its end; what callers pass for anything else is
    ``fstat``'s size, 0 for a pipe, which a first read that gives anything never equals."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"a" * 10)
    assert os.fstat(read_end).st_size == 0  # (Linux: a pipe has no size to trust)

    def write_rest() -> None:
        os.write(write_end, b"b" * 10)
        os.close(write_end)

    writer = threading.Thread(target=write_rest)
    writer.start()
    try:
        assert read_at_most(read_end, 1 << 20, os.fstat(read_end).st_size) == b"a" * 10 + b"b" * 10
    finally:
        writer.join()
        os.close(read_end)
