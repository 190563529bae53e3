"""apply_patch scenarios of the ``*** Begin Patch`` format, written from the format's
description and the cases other implementations test (a move into a new directory,
blanks before a file header, a patch that changes nothing, an empty patch), against a
real daemon. Each scenario: the files before, the patch, and either the files after or
the error with nothing changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon

CONFIG = '[tools.approval]\npreset = "all"\n[tools.edit]\nrequire_read = false\n'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "patches", CONFIG) as d:
        yield d


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def run(daemon: DaemonProcess, files: dict[str, str], patch: str) -> tuple[bool, str, dict[str, str]]:
    root = daemon.root
    for old in sorted(root.rglob("*"), reverse=True):
        old.unlink() if old.is_file() or old.is_symlink() else old.rmdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    with daemon.client(timeout=30) as c:
        result = c.call("apply_patch", {"patch": patch})
    return result.ok, result.content, tree(root)


SCENARIOS = {
    "add a file": ({}, "*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n*** End Patch", {"a.txt": "one\ntwo\n"}),
    "delete a file": ({"a.txt": "x\n"}, "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch", {}),
    "update with context": (
        {"a.txt": "one\ntwo\nthree\n"},
        "*** Begin Patch\n*** Update File: a.txt\n@@\n one\n-two\n+TWO\n three\n*** End Patch",
        {"a.txt": "one\nTWO\nthree\n"},
    ),
    "move into a directory that does not exist yet": (
        {"old/name.txt": "keep\nchange\n"},
        "*** Begin Patch\n*** Update File: old/name.txt\n*** Move to: new/deep/name.txt\n@@\n keep\n-change\n+changed\n"
        "*** End Patch",
        {"new/deep/name.txt": "keep\nchanged\n"},
    ),
    "a pure rename": (
        {"a.txt": "same\n"},
        "*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n*** End Patch",
        {"b.txt": "same\n"},
    ),
    "several files at once": (
        {"a.txt": "a\n", "b.txt": "b\n"},
        "*** Begin Patch\n*** Add File: c.txt\n+c\n*** Delete File: a.txt\n*** Update File: b.txt\n@@\n-b\n+B\n"
        "*** End Patch",
        {"b.txt": "B\n", "c.txt": "c\n"},
    ),
    "blanks before file headers": (
        {"a.txt": "x\n", "b.txt": "y\n"},
        "*** Begin Patch\n  *** Update File: a.txt\n@@\n-x\n+X\n*** Add File: c.txt\n+c\n   *** Delete File: b.txt\n"
        "*** End Patch",
        {"a.txt": "X\n", "c.txt": "c\n"},
    ),
    "a missing final newline is kept": (
        {"a.txt": "one\ntwo"},
        "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n two\n*** End of File\n*** End Patch",
        {"a.txt": "ONE\ntwo"},
    ),
    "a hunk found by its @@ header": (
        {"a.py": "def f():\n    return 1\n\ndef g():\n    return 1\n"},
        "*** Begin Patch\n*** Update File: a.py\n@@ def g():\n-    return 1\n+    return 2\n*** End Patch",
        {"a.py": "def f():\n    return 1\n\ndef g():\n    return 2\n"},
    ),
    "a context line that looks like a header stays context": (
        {"a.txt": "*** Update File: not a header\nx\n"},
        "*** Begin Patch\n*** Update File: a.txt\n@@\n *** Update File: not a header\n-x\n+y\n*** End Patch",
        {"a.txt": "*** Update File: not a header\ny\n"},
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_scenario_applies_exactly(daemon: DaemonProcess, name: str) -> None:
    files, patch, after = SCENARIOS[name]
    ok, content, found = run(daemon, files, patch)
    assert ok, content
    assert found == after


REFUSED = {
    "context that is not in the file": (
        {"a.txt": "one\n", "b.txt": "b\n"},
        "*** Begin Patch\n*** Update File: b.txt\n@@\n-b\n+B\n*** Update File: a.txt\n@@\n-nothere\n+x\n*** End Patch",
        "nothere",
    ),
    "add onto a file that exists": (
        {"a.txt": "mine\n"},
        "*** Begin Patch\n*** Add File: a.txt\n+theirs\n*** End Patch",
        "exists",
    ),
    "move onto a file that exists": (
        {"a.txt": "a\n", "b.txt": "b\n"},
        "*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n*** End Patch",
        "exists",
    ),
    "update of a file that does not exist": (
        {},
        "*** Begin Patch\n*** Update File: ghost.txt\n@@\n-a\n+b\n*** End Patch",
        "does not exist",
    ),
    "an empty patch": ({"a.txt": "a\n"}, "*** Begin Patch\n*** End Patch", "no file operations"),
    "no end marker": ({"a.txt": "a\n"}, "*** Begin Patch\n*** Delete File: a.txt\n", "End Patch"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_refused_scenario_changes_nothing(daemon: DaemonProcess, name: str) -> None:
    files, patch, words = REFUSED[name]
    ok, content, found = run(daemon, files, patch)
    assert not ok and words in content, content
    assert found == files


def test_a_patch_that_changes_nothing_says_so(daemon: DaemonProcess) -> None:
    ok, content, found = run(
        daemon, {"nc.txt": "same\n"}, "*** Begin Patch\n*** Update File: nc.txt\n@@\n-same\n+same\n*** End Patch"
    )
    assert ok and content == "No changes applied." and found == {"nc.txt": "same\n"}
