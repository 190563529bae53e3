"""Class T: commands and tool workers see no process of another uid.

A user's command could read the secret in another user's running ``sh -c "…"`` through
``ps`` or ``/proc/*/cmdline``. Each tool process now has a /proc of its own mounted with
``hidepid=invisible``. Runs only as root (to be two users, and for the daemon to mount).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, reachable_daemon
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be two users")
SECRET = "tok-3f9a7c1e-do-not-leak"
CONFIG = """
[tools.approval]
allowlist = ["shell"]
"""


@pytest.fixture
def shared_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with reachable_daemon(tmp_path, config=CONFIG) as d:
        os.chmod(d.root, 0o777)
        yield d


@pytest.fixture
def secret_process() -> Iterator[subprocess.Popen[bytes]]:
    """User B (nobody) runs a command holding a secret in its argv."""
    proc = subprocess.Popen(["/bin/sh", "-c", f"sleep 30; : {SECRET}"], user=65534, group=65534, extra_groups=[])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _scan(endpoint: str, command: str) -> None:
    from toold_client import Client

    with Client(endpoint, timeout=30) as c:
        result = c.call("shell", {"command": command})
    print(json.dumps([result.ok, result.content]))


@pytest.mark.parametrize(
    "command",
    [
        "ps aux",
        "cat /proc/*/cmdline | tr '\\0' ' '",
        "grep -a tok- /proc/*/cmdline",
        "for d in /proc/[0-9]*; do cat $d/cmdline 2>/dev/null; echo; done",
        "ls /proc",
    ],
)
def test_another_users_command_line_is_not_visible(
    shared_daemon: DaemonProcess, secret_process: subprocess.Popen[bytes], command: str
) -> None:
    """Attack: user A scans the process table for user B's token while B's command runs."""
    assert SECRET.encode() in Path(f"/proc/{secret_process.pid}/cmdline").read_bytes()  # it is there to find
    scanner = OtherUser(functools.partial(_scan, shared_daemon.endpoint, command))
    try:
        ok, content = json.loads(scanner.line())
    finally:
        scanner.kill()
    assert SECRET not in content
    assert str(secret_process.pid) not in content.split()
    assert str(shared_daemon.proc.pid) not in content.split()  # nor the daemon's
    if command == "ps aux":
        assert ok and "ps aux" in content, content  # its own processes are still there


def test_the_layer_is_reported(shared_daemon: DaemonProcess) -> None:
    with shared_daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": "true"})
    assert result.ok
