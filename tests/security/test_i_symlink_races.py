"""Symlink races against every read tool: a process in the workspace swaps a directory
for a symlink to a place outside the roots and back, thousands of times, while an agent
reads through it. No read may return an outside byte: with the userspace checks (the
walk that refuses symlinks), and with them turned off, where the tool worker's kernel
layer (Landlock on the roots) must hold alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, module_daemon

SECRET = "OUTSIDE-SECRET-d1c4"
SECRET_NAME = "outside-only-name.txt"
CONFIG = ""

RACER = """
import os, sys, time
root, outside = sys.argv[1], sys.argv[2]
real, link, spare = f"{root}/dir", f"{root}/dir.link", f"{root}/dir.real"
os.symlink(outside, link)
deadline = time.monotonic() + float(sys.argv[3])
swaps = 0
while time.monotonic() < deadline:
    os.rename(real, spare); os.rename(link, real)      # dir is now a symlink to outside
    os.rename(real, link); os.rename(spare, real)      # and a directory again
    swaps += 1
print(swaps)
"""

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "dir/file.txt"}),
    ("read_many_files", {"paths": ["dir/file.txt"]}),
    ("list_directory", {"path": "dir"}),
    ("glob", {"pattern": "dir/*"}),
    ("grep", {"pattern": "SECRET|INSIDE", "path": "dir"}),
]


def _prepare(tmp: Path, root: Path) -> Path:
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "file.txt").write_text(f"{SECRET}\n")
    (outside / SECRET_NAME).write_text(f"{SECRET}\n")
    (root / "dir").mkdir(exist_ok=True)
    (root / "dir" / "file.txt").write_text("INSIDE\n")
    return outside


@pytest.fixture(scope="module", params=["checked", "kernel-only"])
def daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    env = {"TOOLD_TEST_UNCHECKED_PATHS": "1"} if request.param == "kernel-only" else None
    with module_daemon(tmp_path_factory, f"race-{request.param}", CONFIG, env=env) as d:
        yield d


def test_no_read_tool_returns_an_outside_byte_while_a_directory_is_swapped(daemon: DaemonProcess) -> None:
    """The attack: the workspace holds ``dir``; a racing process swaps it for a symlink to
    a directory outside the roots and back, as fast as it can, while every read tool reads
    through it. A read may fail or see the inside file; it must never see the outside."""
    outside = _prepare(daemon.root.parent, daemon.root)
    with daemon.client(timeout=60) as client:
        layers = {layer.name: layer for layer in client.hello().isolation}
        kernel_only = "TOOLD_TEST_UNCHECKED_PATHS" in (daemon.log.read_text(errors="replace"))
        if kernel_only and not layers["landlock"].available:
            pytest.skip(f"no Landlock here ({layers['landlock'].detail}): the kernel layer cannot hold alone")
        racer = subprocess.Popen(
            [sys.executable, "-c", RACER, str(daemon.root), str(outside), "6"], stdout=subprocess.PIPE, text=True
        )
        seen: dict[str, int] = {}
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for name, args in CALLS:
                    result = client.call(name, args)
                    assert SECRET not in result.content and SECRET_NAME not in result.content, (name, result)
                    assert SECRET not in repr(result.data), (name, result.data)
                    key = f"{name}:{'ok' if result.ok else 'error'}"
                    seen[key] = seen.get(key, 0) + 1
        finally:
            swaps = int(racer.communicate(timeout=30)[0] or 0)
    assert swaps > 1000, f"the racer swapped only {swaps} times"
    assert any(key.endswith(":ok") for key in seen), seen  # the reads did run


def test_kernel_only_mode_refuses_a_plain_symlink_out(daemon: DaemonProcess) -> None:
    """Without the race: a symlink to outside, read directly. With the userspace checks it
    is refused as outside the sandbox; without them, Landlock refuses the open."""
    outside = _prepare(daemon.root.parent, daemon.root)
    link = daemon.root / "plain-link"
    if not link.is_symlink():
        os.symlink(outside / "file.txt", link)
    kernel_only = "TOOLD_TEST_UNCHECKED_PATHS" in daemon.log.read_text(errors="replace")
    with daemon.client(timeout=30) as client:
        landlock = {layer.name: layer for layer in client.hello().isolation}["landlock"]
        if kernel_only and not landlock.available:
            pytest.skip(f"no Landlock here ({landlock.detail})")
        result = client.call("read_file", {"path": "plain-link"})
        assert SECRET not in result.content, result
        assert result.error is not None
        # which layer refused shows that the other one was really off
        assert result.error.type == ("PermissionDenied" if kernel_only else "SandboxViolation"), result.error
        many = client.call("read_many_files", {"paths": ["plain-link"]})
        assert SECRET not in many.content, many
