"""glob, grep and list_directory."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.globmatch import matches
from toold_daemon.tools import ToolContext
from toold_daemon.tools import grep as grep_module
from toold_daemon.tools.glob import Glob
from toold_daemon.tools.grep import Grep, find_ripgrep
from toold_daemon.tools.list_directory import ListDirectory

from .conftest import run

names = st.sampled_from(["a", "b", "c.py", "d.txt", ".hidden", "e.py", "sub", ".cfg"])
trees = st.lists(st.lists(names, min_size=1, max_size=3), min_size=1, max_size=12)


def make_tree(root: Path, paths: list[list[str]]) -> set[str]:
    """Create files at the given paths (skipping ones that clash with a directory); return the files."""
    shutil.rmtree(root)
    root.mkdir()
    files: set[str] = set()
    for parts in paths:
        rel = "/".join(parts)
        if any(rel == f or rel.startswith(f + "/") or f.startswith(rel + "/") for f in files):
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"content of {rel}\nmatch here\nNothing\n")
        files.add(rel)
    return files


def visible(rel: str) -> bool:
    return not any(part.startswith(".") for part in rel.split("/"))


@given(
    tree=trees,
    pattern=st.sampled_from(["**/*.py", "*.py", "**/*", "sub/**", "*/*", "**/d.txt", "?"]),
    hidden=st.booleans(),
)
def test_properties_16_18_glob_matches_all_and_only(
    ctx: ToolContext, root: Path, tree: list[list[str]], pattern: str, hidden: bool
) -> None:
    files = make_tree(root, tree)
    out = run(Glob(), ctx, pattern=pattern, include_hidden=hidden, max_results=10_000)
    expected = sorted((f for f in files if matches(pattern, f) and (hidden or visible(f))), key=lambda p: p.split("/"))
    assert out.data is not None and out.data["matches"] == expected


@given(tree=trees, limit=st.integers(1, 5))
def test_property_17_max_results(ctx: ToolContext, root: Path, tree: list[list[str]], limit: int) -> None:
    files = make_tree(root, tree)
    out = run(Glob(), ctx, pattern="**/*", max_results=limit, include_hidden=True)
    assert out.data is not None and len(out.data["matches"]) == min(limit, len(files))
    assert out.data["truncated"] == (len(files) > limit)


def gitignore_tree(root: Path) -> None:
    for rel in [
        "keep.py",
        "debug.log",
        "build/out.py",
        "src/a.py",
        "src/b.log",
        "src/keep.log",
        "src/gen/x.py",
        "docs/readme.md",
        ".git/config",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("match\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "src" / ".gitignore").write_text("!keep.log\ngen/\n")


def test_property_24_gitignore_in_glob_list_and_grep(ctx: ToolContext, root: Path) -> None:
    gitignore_tree(root)
    expected = ["docs/readme.md", "keep.py", "src/a.py", "src/keep.log"]
    globbed = run(Glob(), ctx, pattern="**/*")
    assert globbed.data is not None and globbed.data["matches"] == expected
    listed = run(ListDirectory(), ctx, recursive=True)
    assert listed.data is not None
    assert [e["path"] for e in listed.data["entries"] if e["type"] == "file"] == expected
    for engine in ("python", "ripgrep"):
        out = grep_with(engine, ctx, pattern="match")
        assert out is None or [line.split(":")[0] for line in out.content.splitlines()] == expected
        # A file filter narrows the search; it must not re-include what .gitignore excludes.
        logs = grep_with(engine, ctx, pattern="match", file_pattern="*.log")
        assert logs is None or logs.content == "src/keep.log:1: match"


def test_gitignore_of_ancestors_applies_when_searching_a_subdirectory(ctx: ToolContext, root: Path) -> None:
    gitignore_tree(root)
    out = run(Glob(), ctx, pattern="*", path="src")
    assert out.data is not None and out.data["matches"] == ["src/a.py", "src/keep.log"]
    with_ignored = run(Glob(), ctx, pattern="**/*", path="src", respect_gitignore=False)
    assert with_ignored.data is not None and "src/b.log" in with_ignored.data["matches"]


def grep_with(engine: str, ctx: ToolContext, **args: object):  # type: ignore[no-untyped-def]
    if engine == "ripgrep":
        if find_ripgrep() is None:
            return None
        return run(Grep(), ctx, **args)
    with mock.patch.object(grep_module, "find_ripgrep", return_value=None):
        return run(Grep(), ctx, **args)


@given(
    tree=trees,
    pattern=st.sampled_from(["match", "MATCH", "content of .*py", "^Not", "e"]),
    case=st.booleans(),
    context=st.integers(0, 2),
    file_pattern=st.sampled_from([None, "*.py", "sub/*"]),
)
def test_properties_19_21_grep_engines_agree(
    ctx: ToolContext,
    root: Path,
    tree: list[list[str]],
    pattern: str,
    case: bool,
    context: int,
    file_pattern: str | None,
) -> None:
    make_tree(root, tree)
    args: dict[str, object] = {"pattern": pattern, "case_sensitive": case, "context_lines": context}
    if file_pattern:
        args["file_pattern"] = file_pattern
    python = grep_with("python", ctx, **args)
    assert python.data is not None and python.data["engine"] == "python"
    rg = grep_with("ripgrep", ctx, **args)
    if rg is not None:
        assert rg.data is not None and rg.data["engine"] == "ripgrep"
        assert rg.content == python.content


def test_grep_output_format_case_and_file_filter(ctx: ToolContext, root: Path) -> None:
    (root / "a.py").write_text("Alpha\nbeta\nALPHA beta\n")
    (root / "b.txt").write_text("alpha\n")
    for engine in ("python", "ripgrep"):
        sensitive = grep_with(engine, ctx, pattern="Alpha")
        if sensitive is None:
            continue
        assert sensitive.content == "a.py:1: Alpha"
        insensitive = grep_with(engine, ctx, pattern="alpha", case_sensitive=False)
        assert insensitive.content.splitlines() == ["a.py:1: Alpha", "a.py:3: ALPHA beta", "b.txt:1: alpha"]
        filtered = grep_with(engine, ctx, pattern="alpha", case_sensitive=False, file_pattern="*.txt")
        assert filtered.content == "b.txt:1: alpha"
        context = grep_with(engine, ctx, pattern="beta$", context_lines=1, file_pattern="*.py")
        assert context.content.splitlines() == ["a.py-1- Alpha", "a.py:2: beta", "a.py:3: ALPHA beta"]
        limited = grep_with(engine, ctx, pattern="a", case_sensitive=False, max_results=2)
        assert limited.data is not None and limited.data["matches"] == 2 and limited.data["truncated"]


def test_grep_skips_denied_and_binary_files(ctx: ToolContext, root: Path) -> None:
    (root / ".env").write_text("API_KEY=secret-match\n")
    (root / "id_rsa").write_text("secret-match\n")
    (root / "blob.bin").write_bytes(b"secret-match\x00\x01")
    (root / "ok.txt").write_text("secret-match\n")
    for engine in ("python", "ripgrep"):
        out = grep_with(engine, ctx, pattern="secret-match", include_hidden=True)
        if out is not None:
            assert out.content == "ok.txt:1: secret-match", engine


def test_grep_rejects_invalid_regex(ctx: ToolContext) -> None:
    from toold_daemon.errors import ToolError

    with pytest.raises(ToolError) as info:
        run(Grep(), ctx, pattern="(unclosed")
    assert info.value.code == "BAD_ARGS"


def test_grep_falls_back_to_python_for_lookaround(ctx: ToolContext, root: Path) -> None:
    (root / "a.txt").write_text("foobar\nfoobaz\n")
    out = run(Grep(), ctx, pattern="foo(?=baz)")
    assert out.content == "a.txt:2: foobaz"
    assert out.data is not None and out.data["engine"] == "python"


@given(tree=trees, hidden=st.booleans())
def test_property_22_listing_is_complete(ctx: ToolContext, root: Path, tree: list[list[str]], hidden: bool) -> None:
    make_tree(root, tree)
    out = run(ListDirectory(), ctx, include_hidden=hidden)
    expected = sorted(p.name for p in root.iterdir() if hidden or not p.name.startswith("."))
    assert out.data is not None and [e["name"] for e in out.data["entries"]] == expected
    assert json.loads(out.content) == out.data


@given(tree=trees, depth=st.integers(1, 3))
def test_property_23_recursion_and_max_depth(ctx: ToolContext, root: Path, tree: list[list[str]], depth: int) -> None:
    files = make_tree(root, tree)
    out = run(ListDirectory(), ctx, recursive=True, max_depth=depth, include_hidden=True)
    assert out.data is not None
    listed = [e["path"] for e in out.data["entries"]]
    assert all(p.count("/") < depth for p in listed)
    expected_files = {f for f in files if f.count("/") < depth}
    assert {e["path"] for e in out.data["entries"] if e["type"] == "file"} == expected_files


def test_symlinks_are_reported_not_followed(ctx: ToolContext, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    (root / "link").symlink_to(outside)
    out = run(ListDirectory(), ctx, recursive=True)
    assert out.data is not None
    assert out.data["entries"] == [
        {**out.data["entries"][0], "name": "link", "type": "symlink", "target": "(outside the workspace)"}
    ]
    assert str(outside) not in out.content  # where it points is not revealed
    globbed = run(Glob(), ctx, pattern="**/*.txt")
    assert globbed.data is not None and globbed.data["matches"] == []


def test_max_entries_truncates(ctx: ToolContext, root: Path) -> None:
    for i in range(20):
        (root / f"f{i:02}").write_text("")
    out = run(ListDirectory(), ctx, max_entries=5)
    assert out.data is not None and len(out.data["entries"]) == 5 and out.data["truncated"]


def test_python_engine_refuses_catastrophic_patterns(ctx: ToolContext, root: Path) -> None:
    from toold_daemon.errors import ToolError

    (root / "a.txt").write_text("a" * 40 + "b\n")
    for pattern in ["(a+)+$(?<=x)", "(?=a)(\\w*a)*c", "(?!z)(x+y?)+z"]:
        with pytest.raises(ToolError) as info:
            grep_with("python", ctx, pattern=pattern)
        assert info.value.code == "BAD_ARGS" and "exponential" in info.value.message
    ok = grep_with("python", ctx, pattern="(ab)+|a{3}")
    assert ok is not None and ok.content.startswith("a.txt:1:")


def test_listing_a_file_or_a_missing_path_is_a_typed_error(ctx: ToolContext, root: Path) -> None:
    from toold_daemon.errors import ToolError

    (root / "a.txt").write_text("a\n")
    for path, code in (("a.txt", "NOT_A_DIRECTORY"), ("missing", "FILE_NOT_FOUND")):
        with pytest.raises(ToolError) as info:
            run(ListDirectory(), ctx, path=path)
        assert info.value.code == code and path in info.value.message


def test_a_directory_deeper_than_path_max_is_listed(ctx: ToolContext, root: Path) -> None:
    """Reached a name at a time, as the tools write and read it: the check that it is a
    directory went by its whole path, and past 4,096 bytes raised an untyped OSError."""
    deep = "/".join(["d" * 50] * 90)  # 4,589 bytes
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(90):
        os.mkdir("d" * 50, dir_fd=fd)
        inner = os.open("d" * 50, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    out = run(ListDirectory(), ctx, path=deep)
    assert out.data is not None and [e["name"] for e in out.data["entries"]] == ["f.txt"]


def test_a_glob_of_too_many_alternatives_is_refused_as_bad_arguments(ctx: ToolContext) -> None:
    from toold_daemon.errors import ToolError

    for tool, arguments in (
        (Glob(), {"pattern": "{a,b}" * 9}),
        (Grep(), {"pattern": "x", "file_pattern": "{a,b}" * 9}),
    ):
        with pytest.raises(ToolError) as info:
            run(tool, ctx, **arguments)
        assert info.value.code == "BAD_ARGS" and "more than 256 alternatives" in info.value.message


def test_a_glob_of_many_stars_answers_at_once(ctx: ToolContext, root: Path) -> None:
    (root / ("a" * 200)).write_text("needle\n")
    (root / ("a" * 199 + "b")).write_text("needle\n")
    pattern = "*a" * 20 + "*b"
    assert run(Glob(), ctx, pattern=pattern).content == "a" * 199 + "b"
    found = run(Grep(), ctx, pattern="needle", file_pattern=pattern)
    assert found.content == "a" * 199 + "b:1: needle"


def test_the_python_engine_reads_a_line_at_a_time(ctx: ToolContext, root: Path) -> None:
    """The Python engine (it runs whenever ripgrep refuses a pattern, a look-ahead) read
    each file whole: one of 5 GB failed with MemoryError. It now reads a line at a time,
    at most 1 MiB of one, and a long line costs no more than that."""
    with open(root / "sparse.bin", "wb") as f:
        f.truncate(5 << 30)  # NULs: passed over as binary after its first 8 KiB
    with open(root / "long.log", "wb") as f:
        f.write(b"needle at the start of a long line " + b"x" * (40 << 20) + b"\n")
        f.write(b"before\nneedle again\nafter\n")
    tracemalloc.start()
    try:
        out = grep_with("python", ctx, pattern="needle(?= )", context_lines=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out is not None and out.data is not None and out.data["engine"] == "python"
    numbered = [line[len("long.log") :].split(" ", 1)[0] for line in out.content.splitlines()]
    assert numbered == [":1:", "-2-", ":3:", "-4-"], out.content[:300]  # (the matches, and a line either side)
    assert peak < 16 << 20, f"grep peaked at {peak} bytes"
