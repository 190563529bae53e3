"""Staged writes on real files: new content is written to an unnamed file (O_TMPFILE)
and linked in only to be renamed over its target, so a writer killed meanwhile leaves
nothing in the user's directory; where an unnamed file cannot be linked in, it is copied
to a named temp file and the write is still whole."""

from __future__ import annotations

import errno
import os
import signal
import stat
from pathlib import Path

import pytest

from toold_daemon.sandbox import writes

UNNAMED = bool(getattr(os, "O_TMPFILE", 0))


def killed_after_staging(directory: Path, name: str, data: bytes) -> None:
    """A forked child stages ``data`` beside ``name`` and is killed before it is put in place."""
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            writes.stage(fd, name, data, mode=None, shown=name)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


@pytest.mark.skipif(not UNNAMED, reason="no O_TMPFILE on this platform")
def test_a_writer_killed_after_staging_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old\n")
    killed_after_staging(tmp_path, "a.txt", b"x" * 1_000_000)
    assert os.listdir(tmp_path) == ["a.txt"]  # a named temp file used to stay here
    assert (tmp_path / "a.txt").read_text() == "old\n"


def test_a_staged_write_keeps_the_mode_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old\n")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        writes.atomic_write(fd, "a.txt", b"new\n", mode=0o640, shown="a.txt")
        writes.discard_staged(fd, writes.stage(fd, "b.txt", b"never\n", mode=None, shown="b.txt"))
    finally:
        os.close(fd)
    assert target.read_text() == "new\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["a.txt"]


@pytest.mark.skipif(not UNNAMED, reason="no O_TMPFILE on this platform")
def test_an_unnamed_file_that_cannot_be_linked_in_is_copied_and_the_write_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No /proc (or a kernel refusing the link): the content reaches its target by a
    named copy, with its mode, and later writes stage named temp files from the start."""
    real_link = os.link

    def no_proc(src: str, dst: str, **kwargs: object) -> None:
        if src.startswith("/proc/self/fd/"):
            raise OSError(errno.ENOENT, "No such file or directory", src)
        real_link(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "link", no_proc)
    monkeypatch.setattr(writes, "_unnamed", [True])
    data = os.urandom(3 << 20)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        staged = writes.stage(fd, "big.bin", data, mode=0o600, shown="big.bin")
        assert staged.fd >= 0 and not staged.temp  # unnamed while its bytes were written
        writes.put_in_place(fd, staged, "big.bin", shown="big.bin")
        assert not writes._unnamed[0]
        later = writes.stage(fd, "c.txt", b"c\n", mode=None, shown="c.txt")
        assert later.temp and later.fd < 0  # named from now on
        writes.discard_staged(fd, later)
    finally:
        os.close(fd)
    assert (tmp_path / "big.bin").read_bytes() == data
    assert stat.S_IMODE((tmp_path / "big.bin").stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["big.bin"]
