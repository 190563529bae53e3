"""A reader waiting to open a FIFO named like an ignore file is given an empty file;
nothing else is touched."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pytest import MonkeyPatch

from toold_daemon.tools import _fifo_ignores


def _reading(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:  # waits for a writer
            got.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_a_reader_held_by_a_fifo_ignore_file_is_freed_and_nothing_else_is_touched(tmp_path: Path) -> None:
    (tmp_path / "above" / "searched" / "deeper").mkdir(parents=True)
    held = tmp_path / "above" / "searched" / "deeper" / ".gitignore"
    parent = tmp_path / "above" / ".ignore"  # in a directory between the root and the searched one
    idle = tmp_path / "above" / "searched" / ".rgignore"  # nobody reads it
    other = tmp_path / "above" / "searched" / "pipe"  # not an ignore file's name
    for fifo in (held, parent, idle, other):
        os.mkfifo(fifo)
    readers = [_reading(held), _reading(parent), _reading(other)]
    for thread, _ in readers:
        thread.join(0.2)
        assert thread.is_alive()  # waiting for a writer
    assert _fifo_ignores.release(str(tmp_path), str(tmp_path / "above" / "searched")) == 2
    for thread, got in readers[:2]:
        thread.join(5)
        assert got == [b""]  # an empty ignore file
    assert readers[2][0].is_alive()  # the FIFO of another name is left alone
    fd = os.open(other, os.O_WRONLY | os.O_NONBLOCK)  # (let the test's reader go)
    os.close(fd)
    readers[2][0].join(5)


def _lines_from(pieces: list[bytes], tmp_path: Path) -> list[bytes]:
    """What ``lines_freeing_fifos`` yields for output written as ``pieces``, each a
    chunk of its own (a pause between them), through a real pipe."""
    read_end, write_end = os.pipe()

    def write() -> None:
        for piece in pieces:
            os.write(write_end, piece)
            threading.Event().wait(0.02)
        os.close(write_end)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        return list(_fifo_ignores.lines_freeing_fifos(read_end, str(tmp_path), str(tmp_path)))
    finally:
        os.close(read_end)
        writer.join(5)


def test_output_lines_come_whole_across_chunks_and_the_last_as_it_ends(tmp_path: Path) -> None:
    lines = _lines_from([b"a\nb", b"b\n", b"\nc:1", b"\x00d"], tmp_path)
    assert lines == [b"a\n", b"bb\n", b"\n", b"c:1\x00d"]


def test_a_silent_search_frees_its_reader_and_goes_on_reading(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    monkeypatch.setattr(_fifo_ignores, "SILENT_SECONDS", 0.05)
    os.mkfifo(tmp_path / ".gitignore")
    reader, got = _reading(tmp_path / ".gitignore")  # ripgrep, held
    read_end, write_end = os.pipe()
    lines: list[bytes] = []
    consumer = threading.Thread(
        target=lambda: lines.extend(_fifo_ignores.lines_freeing_fifos(read_end, str(tmp_path), str(tmp_path))),
        daemon=True,
    )
    consumer.start()
    try:
        reader.join(5)
        assert got == [b""]  # freed while no output came
        os.write(write_end, b"x:1:found\n")
    finally:
        os.close(write_end)
        consumer.join(5)
        os.close(read_end)
    assert not consumer.is_alive()
    assert lines == [b"x:1:found\n"]


def test_a_line_longer_than_the_bound_keeps_its_start_and_the_next_lines_come_whole(tmp_path: Path) -> None:
    bound = _fifo_ignores.LINE_BYTES_KEPT
    long_line = b"p\x001:" + bytes(range(11, 256)) * (5 * bound // 245)  # no newline; five bounds, many chunks
    lines = _lines_from([b"a\n" + long_line + b"\nb\n" + long_line], tmp_path)
    assert lines == [b"a\n", long_line[:bound] + b"\n", b"b\n", long_line[:bound]]
