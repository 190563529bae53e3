"""A file name need not be UTF-8 (``bad<0xff>.txt``): the system hands it to Python as
text holding a lone surrogate, which no message can carry. A tool that met one in a
directory failed whole (``UnicodeEncodeError``); now such a name is shown with U+FFFD
for each such byte, as ripgrep and ls show it, and undo never recreates it under that
other name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import CallSpec

EVERYTHING = """
[tools.approval]
preset = "all"
"""
SHOWN = "bad\N{REPLACEMENT CHARACTER}.txt"


def _plant(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "good.txt").write_text("needle good\n")
    with open(os.path.join(os.fsencode(directory), b"bad\xff.txt"), "w") as f:
        f.write("needle bad\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "names", EVERYTHING) as d:
        _plant(d.root / "listed")
        yield d


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list_directory", {"path": "listed"}),
        ("glob", {"pattern": "listed/*.txt"}),
        ("grep", {"pattern": "needle", "path": "listed"}),
        ("read_many_files", {"paths": ["listed/*.txt"]}),
    ],
)
def test_a_directory_holding_a_name_that_is_not_utf8_is_shown_whole(
    daemon: DaemonProcess, tool: str, arguments: dict[str, object]
) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call(tool, arguments)
    assert result.ok, result.content
    assert SHOWN in result.content and "good.txt" in result.content, result.content


def test_undo_of_a_deleted_tree_puts_back_what_it_can_name_and_says_what_it_cannot(daemon: DaemonProcess) -> None:
    _plant(daemon.root / "doomed")
    with daemon.client(timeout=30) as c:
        deleted = c.submit([CallSpec("delete_file", {"path": "doomed", "recursive": True})])
        assert deleted.results[0].ok, deleted.results[0].content
        assert not (daemon.root / "doomed").exists()
        assert "not UTF-8" in deleted.results[0].content, deleted.results[0].content
        undone = c.undo(deleted.batch_id, force=True)
    assert (daemon.root / "doomed" / "good.txt").read_text() == "needle good\n"
    assert os.listdir(daemon.root / "doomed") == ["good.txt"], undone  # never "bad\ufffd.txt"
