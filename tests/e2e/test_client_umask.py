"""Files a client's calls make get the modes the person would get: its umask travels in
its hello and applies to commands (``shell``) and to the file tools, instead of the
daemon's private 0077."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import DaemonProcess
from toold_client import APPROVE_ALL, Client


@contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: os.PathLike[str] | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_commands_and_tools_make_files_with_the_clients_umask(daemon: DaemonProcess) -> None:
    for value, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750), (0o077, 0o600, 0o700)):
        name = f"u{value:03o}"
        with umask(value), Client(daemon.endpoint, timeout=30) as c:
            shell = c.call(
                "shell", {"command": f"touch {name}.sh.txt && mkdir {name}.dir"}, on_confirm=lambda r: APPROVE_ALL
            )
            written = c.call(
                "write_file", {"path": f"{name}/made/by-tool.txt", "content": "x"}, on_confirm=lambda r: APPROVE_ALL
            )
        assert shell.ok and written.ok, (shell.content, written.content)
        root = daemon.root
        assert mode(root / f"{name}.sh.txt") == file_mode, name
        assert mode(root / f"{name}.dir") == dir_mode, name
        assert mode(root / name / "made" / "by-tool.txt") == file_mode, name
        assert mode(root / name / "made") == dir_mode, name
