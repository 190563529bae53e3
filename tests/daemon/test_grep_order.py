"""grep runs ripgrep on every core and puts its hits in the order ``--sort=path`` gives:
checked against ripgrep's own sorted output on a tree where byte order and path order
differ, and the cut at ``max_results`` keeps the first matches in that order."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import msgspec
import pytest

from toold_daemon.config import Config
from toold_daemon.sandbox import Sandbox
from toold_daemon.tools import ToolContext
from toold_daemon.tools.grep import (
    MAX_LINE_CHARS,
    RIPGREP_FLAGS,
    Grep,
    GrepArgs,
    Hit,
    _first_matches,
    _in_path_order,
    _parse_rg_line,
    find_ripgrep,
)


def test_unsorted_hits_come_out_in_ripgreps_path_order(tmp_path: Path) -> None:
    rg = find_ripgrep()
    if rg is None:
        pytest.skip("ripgrep not installed")
    rng = random.Random(3)
    for name in [
        "a/b.txt",
        "a-b.txt",
        "a.b/c.txt",
        "a/b/c.txt",
        "Z.txt",
        "é.txt",
        *(f"d{i}/f{i}.txt" for i in range(60)),
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join("needle\n" if rng.random() < 0.5 else "hay\n" for _ in range(5)) + "needle\n")
    base = [rg, *RIPGREP_FLAGS, "--context=1", "--regexp", "needle", "--", "."]

    def hits(extra: list[str]) -> list[Hit]:
        out = subprocess.run([*base[:1], *extra, *base[1:]], cwd=tmp_path, capture_output=True, check=True).stdout
        return [h for line in out.splitlines(keepends=True) if (h := _parse_rg_line(line, ".")) is not None]

    assert _in_path_order(hits([])) == hits(["--sort=path"])


def test_the_cut_keeps_one_match_past_the_limit_and_the_context_before_it() -> None:
    hits = [Hit("a", 1, "x", True), Hit("a", 2, "ctx", False), Hit("b", 1, "y", True), Hit("b", 2, "z", True)]
    assert _first_matches(hits, 1) == hits[:3]
    assert _first_matches(hits, 5) == hits


def test_hits_show_paths_as_the_workspace_does_in_the_first_root_and_in_another(tmp_path: Path) -> None:
    """Relative to the first root, absolute in any other."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "a.txt").write_text("needle\n")
    sandbox = Sandbox([first, second], allow_absolute=True)
    tool = Grep()
    for searched, expected in [
        ("sub", "sub/a.txt:1: needle"),
        (str(second.resolve() / "sub"), f"{second.resolve()}/sub/a.txt:1: needle"),
    ]:
        args = msgspec.convert({"pattern": "needle", "path": searched}, GrepArgs)
        output = tool.run(args, ToolContext(call_id="c", sandbox=sandbox, config=Config()))
        assert output.content == expected, (searched, output.content)


def test_a_line_of_many_megabytes_is_shown_cut_and_costs_a_bounded_read(tmp_path: Path) -> None:
    """A minified file's one line: ripgrep prints all of it; the tool keeps its start."""
    if find_ripgrep() is None:
        pytest.skip("ripgrep not installed")
    long_line = "needle " + "é" * (8 << 20)  # 16 MB of UTF-8 on one line
    (tmp_path / "min.js").write_text(f"short needle\n{long_line}\nneedle at the end\n")
    args = msgspec.convert({"pattern": "needle"}, GrepArgs)
    output = Grep().run(args, ToolContext(call_id="c", sandbox=Sandbox([tmp_path]), config=Config()))
    assert output.data is not None and output.data["engine"] == "ripgrep"
    lines = output.content.splitlines()
    assert lines[0] == "min.js:1: short needle"
    assert lines[1] == f"min.js:2: {long_line[:MAX_LINE_CHARS]}…"
    assert lines[2] == "min.js:3: needle at the end"
