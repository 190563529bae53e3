"""Class D: denied files stay denied for commands wherever they lie and whatever their
names' bytes. Two places the commands' stand-ins used to miss:

- A tree nested past PATH_MAX (4096 bytes): every name is short, the whole path is not.
  The walk that finds denied files could not open such a directory and passed over it
  in silence, so a secret there was not covered, while a command reaches it by changing
  directory one name at a time (and the layer still said "on").
- A name that is not UTF-8 (``.env.<0xff>``): covering it failed to encode its path, and
  every command in that workspace then failed, the fresh child as well as the zygote.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.deep_trees import nested, write_at

YOLO = """
[tools.approval]
preset = "all"
"""
SECRET = "DEEP_SECRET=do-not-leak"
NAME = "d" * 250
DEPTH = 20  # 20 x 251 bytes: well past PATH_MAX below any root


def _make_deep(root: Path) -> None:
    """root/NAME/NAME/... (DEPTH levels) holding a secret, a hard link to the root's
    secret under an innocent name, and a git directory; made one level at a time (the
    whole path is too long for any one system call)."""
    (root / ".env").write_text("TOP_SECRET=also-not\n")
    with nested(root, NAME, DEPTH) as bottom:
        write_at(bottom, ".env", SECRET + "\n")
        write_at(bottom, "readme.txt", "public\n")
        os.link(root / ".env", "innocent.txt", dst_dir_fd=bottom)
        os.mkdir(".git", dir_fd=bottom)
        os.mkdir(".git/hooks", dir_fd=bottom)


def _deep_command(body: str) -> str:
    """A command that walks down the deep tree by relative steps, then runs ``body``
    (Python source) there: the shell's ``cd`` keeps the whole path and fails past
    PATH_MAX, a process's own ``chdir`` does not."""
    source = f"import os\nfor _ in range({DEPTH}): os.chdir({NAME!r})\n{body}"
    encoded = base64.b64encode(source.encode()).decode()
    return f"python3 -c \"exec(__import__('base64').b64decode('{encoded}'))\""


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "deep", YOLO) as d:
        _make_deep(d.root)
        yield d


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "odd", YOLO) as d:
        with open(os.path.join(os.fsencode(d.root), b".env.\xff"), "w") as f:
            f.write("ODD_NAME_SECRET=hidden-too\n")
        yield d


def test_a_denied_file_nested_past_path_max_reads_as_its_stand_in(deep: DaemonProcess) -> None:
    read = "print(open('readme.txt').read()); print(open('.e' + 'nv').read()); print(open('innocent.txt').read())"
    with deep.client(timeout=30) as c:
        result = c.call("shell", {"command": _deep_command(read)})
    assert "public" in result.content, result.content  # the command got there
    assert "DEEP_SECRET" not in result.content, result.content
    assert "TOP_SECRET" not in result.content, result.content  # nor through a hard link there


def test_a_git_hook_cannot_be_planted_past_path_max(deep: DaemonProcess) -> None:
    plant = (
        "try:\n"
        "    open('.git/hooks/pre-commit', 'w').write('#!/bin/sh\\necho pwned\\n')\n"
        "    print('planted')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.strerror)"
    )
    with deep.client(timeout=30) as c:
        result = c.call("shell", {"command": _deep_command(plant)})
    assert "refused Read-only file system" in result.content, result.content


def test_a_denied_file_whose_name_is_not_utf8_is_covered_and_commands_still_run(odd: DaemonProcess) -> None:
    with odd.client(timeout=30) as c:
        result = c.call("shell", {"command": "cat $(printf .e)nv.$(printf '\\377'); echo still-running"})
    assert result.ok, result.content
    assert "still-running" in result.content
    assert "ODD_NAME_SECRET" not in result.content, result.content
