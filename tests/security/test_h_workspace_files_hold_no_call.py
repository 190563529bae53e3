"""Class H: what a workspace holds cannot hold a call. Anyone who may write the workspace
(the model, with one command) can plant either of these, and both held every ``glob``
and ``list_directory`` below them until the call's time limit, for good:

- a FIFO named ``.gitignore``: opening a FIFO for reading waits for a writer;
- a ``.gitignore`` line built to backtrack (``**/a*a*a*…*b``) beside a long name: the
  usual compilation of the line tries exponentially many ways to match it.

ripgrep opens a FIFO so named too, and waits; the grep tool frees it once it has been
silent a second (``tools/_fifo_ignores``). And a file of one line of 64 MB (a minified
file, or one written to that end) that matches: ripgrep prints the whole line, and the
tool keeps its first 64 KiB, reading the rest in linear time (gathered by joining each
piece onto the line so far, it took the grep minutes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon

EVERYTHING = """
[tools.approval]
preset = "all"
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "special", EVERYTHING) as d:
        piped = d.root / "piped"
        (piped / "inner").mkdir(parents=True)
        os.mkfifo(piped / ".gitignore")
        os.mkfifo(piped / "inner" / "fifo.txt")
        (piped / "inner" / "plain.txt").write_text("needle\n")
        backtracking = d.root / "backtracking"
        backtracking.mkdir()
        (backtracking / ".gitignore").write_text("**/a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b\n")
        (backtracking / ("a" * 60)).write_text("needle\n")
        (backtracking / "plain.txt").write_text("needle\n")
        minified = d.root / "minified"
        minified.mkdir()
        (minified / "min.js").write_text("needle " + "x" * (64 << 20) + "\n")
        (minified / "plain.txt").write_text("needle\n")
        yield d


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("glob", {"pattern": "**/*.txt", "path": "piped"}),
        ("list_directory", {"path": "piped", "recursive": True}),
        ("grep", {"pattern": "needle", "path": "piped"}),
        ("grep", {"pattern": "needle", "path": "backtracking"}),
        ("grep", {"pattern": "needle", "path": "minified"}),
        ("read_many_files", {"paths": ["piped/**/*.txt"]}),
        ("glob", {"pattern": "**/*.txt", "path": "backtracking"}),
        ("list_directory", {"path": "backtracking"}),
    ],
)
def test_a_planted_file_holds_no_call(daemon: DaemonProcess, tool: str, arguments: dict[str, object]) -> None:
    with daemon.client(timeout=30) as c:
        started = time.monotonic()
        result = c.call(tool, arguments, timeout=25)
        took = time.monotonic() - started
    assert result.ok, result.content
    assert "plain.txt" in result.content, result.content
    assert took < 5, took
