"""read_file and read_many_files."""

from __future__ import annotations

import base64
import os
import tracemalloc
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.config import Config, ReadFileConfig, ToolsConfig
from toold_daemon.errors import ToolError
from toold_daemon.tools import ToolContext
from toold_daemon.tools.read_file import ReadFile
from toold_daemon.tools.read_many_files import ReadManyFiles

from .conftest import make_ctx, run

text_content = st.text(alphabet=st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=2000)


@given(content=text_content, newline=st.sampled_from(["\n", "\r\n"]))
def test_property_6_round_trip(ctx: ToolContext, root: Path, content: str, newline: str) -> None:
    content = content.replace("\n", newline)
    (root / "f.txt").write_bytes(content.encode("utf-8", "surrogatepass"))
    try:
        content.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates are not UTF-8 text; covered as binary below
    out = run(ReadFile(), ctx, path="f.txt")
    assert out.content == content


@given(data=st.binary(max_size=3000))
def test_round_trip_bytes_with_base64(ctx: ToolContext, root: Path, data: bytes) -> None:
    (root / "b.bin").write_bytes(data)
    out = run(ReadFile(), ctx, path="b.bin", encoding="base64")
    assert base64.b64decode(out.content) == data


@given(
    lines=st.lists(st.text(alphabet="abc é\t", max_size=10), min_size=1, max_size=40),
    start=st.integers(1, 45),
    length=st.integers(0, 45),
    final_newline=st.booleans(),
)
def test_property_7_line_ranges(
    ctx: ToolContext, root: Path, lines: list[str], start: int, length: int, final_newline: bool
) -> None:
    text = "\n".join(lines) + ("\n" if final_newline else "")
    (root / "l.txt").write_text(text, newline="")
    end = start + length
    out = run(ReadFile(), ctx, path="l.txt", start_line=start, end_line=end)
    expected = "".join(text.splitlines(keepends=True)[start - 1 : end])
    assert out.content == expected
    only_start = run(ReadFile(), ctx, path="l.txt", start_line=start)
    assert only_start.content == "".join(text.splitlines(keepends=True)[start - 1 :])


def test_range_validation(ctx: ToolContext, root: Path) -> None:
    (root / "f").write_text("a\n")
    with pytest.raises(ToolError) as info:
        run(ReadFile(), ctx, path="f", start_line=3, end_line=2)
    assert info.value.code == "BAD_ARGS"
    with pytest.raises(msgspec.ValidationError):
        run(ReadFile(), ctx, path="f", start_line=0)


@given(name=st.text(alphabet="abcxyz_", min_size=1, max_size=12))
def test_property_8_missing_file(ctx: ToolContext, name: str) -> None:
    with pytest.raises(ToolError) as info:
        run(ReadFile(), ctx, path=f"missing/{name}")
    assert info.value.type == "FileNotFound" and info.value.code == "FILE_NOT_FOUND"


def test_binary_file_comes_back_as_base64_with_a_header(ctx: ToolContext, root: Path) -> None:
    data = b"\x89PNG\x00\x01\x02" * 10
    (root / "img.png").write_bytes(data)
    out = run(ReadFile(), ctx, path="img.png")
    header, _, body = out.content.partition("\n")
    assert header.startswith("[binary file img.png: 70 bytes")
    assert base64.b64decode(body) == data
    assert not out.allow_truncation


def test_invalid_utf8_is_binary(ctx: ToolContext, root: Path) -> None:
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert run(ReadFile(), ctx, path="latin1.txt").content.startswith("[binary file")


def test_size_limit_points_to_line_ranges(root: Path) -> None:
    config = Config(tools=ToolsConfig(read_file=ReadFileConfig(max_file_read_bytes=100, max_scan_bytes=1000)))
    ctx = make_ctx(root, config)
    (root / "big.txt").write_text("line\n" * 100)
    with pytest.raises(ToolError) as info:
        run(ReadFile(), ctx, path="big.txt")
    assert info.value.code == "FILE_TOO_LARGE" and "start_line" in info.value.message
    assert run(ReadFile(), ctx, path="big.txt", start_line=2, end_line=3).content == "line\nline\n"
    (root / "huge.txt").write_text("line\n" * 1000)
    with pytest.raises(ToolError) as scan:
        run(ReadFile(), ctx, path="huge.txt", start_line=900, end_line=901)
    assert scan.value.code == "LIMITS_EXCEEDED"


def test_line_numbers_and_metadata(ctx: ToolContext, root: Path) -> None:
    (root / "n.txt").write_text("a\nb\nc\n")
    out = run(ReadFile(), ctx, path="n.txt", start_line=2, line_numbers=True)
    assert out.content == "     2\tb\n     3\tc\n"
    whole = run(ReadFile(), ctx, path="n.txt")
    assert whole.data is not None and whole.data["total_lines"] == 3 and len(whole.data["sha256"]) == 64


def test_directory_and_fifo_are_refused(ctx: ToolContext, root: Path) -> None:
    (root / "d").mkdir()
    os.mkfifo(root / "fifo")
    with pytest.raises(ToolError) as info:
        run(ReadFile(), ctx, path="d")
    assert info.value.code == "IS_A_DIRECTORY"
    with pytest.raises(ToolError) as fifo:
        run(ReadFile(), ctx, path="fifo")
    assert fifo.value.code == "NOT_A_REGULAR_FILE"


@given(
    files=st.dictionaries(
        st.text(alphabet="abcdef", min_size=1, max_size=6),
        st.text(alphabet="xyz \n", max_size=30),
        min_size=1,
        max_size=6,
    )
)
def test_property_9_many_files_have_headers(ctx: ToolContext, root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        (root / f"{name}.md").write_text(content)
    out = run(ReadManyFiles(), ctx, paths=[f"{name}.md" for name in files])
    for name, content in files.items():
        assert f"--- {name}.md ---\n{content}" in out.content


def test_many_files_reports_errors_per_file_and_expands_globs(ctx: ToolContext, root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("A")
    (root / "src" / "b.py").write_text("B")
    out = run(ReadManyFiles(), ctx, paths=["src/*.py", "nope.txt", "src/a.py"])
    assert out.content.index("--- src/a.py ---\nA") < out.content.index("--- src/b.py ---\nB")
    assert "--- nope.txt ---\n[error FILE_NOT_FOUND" in out.content
    assert out.content.count("--- src/a.py ---") == 1
    assert out.data is not None and [f["ok"] for f in out.data["files"]] == [True, True, False]


def test_a_small_read_never_allocates_the_limit(root: Path) -> None:
    """A whole-file read asks for the bytes the file has, not for its limit: a buffer of the
    limit, allocated and freed at every read, was most of the worker's time for a 4 KB
    file (an mmap, page faults and a munmap past 128 KiB)."""
    (root / "small.txt").write_text("x" * 4095 + "\n")
    limit = 64 << 20
    config = Config(tools=ToolsConfig(read_file=ReadFileConfig(max_file_read_bytes=limit)))
    ctx = make_ctx(root, config)
    run(ReadFile(), ctx, path="small.txt")  # the first read's imports and caches
    tracemalloc.start()
    try:
        out = run(ReadFile(), ctx, path="small.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.content == "x" * 4095 + "\n"
    assert peak < 1 << 20, f"a 4 KB read peaked at {peak} bytes"


def test_a_range_of_a_file_with_one_endless_line_stops_at_the_scan_limit(ctx: ToolContext, root: Path) -> None:
    """A ranged read is what the tool offers for a file too large to read whole; a line
    was read whole before its length was weighed, and one of 5 GB (a sparse file, a log
    without newlines) failed with MemoryError. It now stops at max_scan_bytes, as any
    range that would scan too far does, having read no more than that."""
    with open(root / "huge.log", "wb") as f:
        f.truncate(5 << 30)
    with pytest.raises(ToolError) as info:
        run(ReadFile(), ctx, path="huge.log", start_line=1, end_line=2)
    assert info.value.code == "LIMITS_EXCEEDED" and "max_scan_bytes" in info.value.message
    (root / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 100)))
    out = run(ReadFile(), ctx, path="lines.txt", start_line=98, end_line=200, line_numbers=False)
    assert out.content == "line 98\nline 99\n" and out.data is not None and out.data["end_line"] == 99
