"""Socket activation without systemd as PID 1: ``systemd-socket-activate`` binds the
socket and starts the daemon on the first connection, passing the socket."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN

ACTIVATE = shutil.which("systemd-socket-activate")
pytestmark = pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed")


def toolctl(socket_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "toolctl"), "--endpoint", f"ipc://{socket_path}", *args], capture_output=True, text=True, timeout=60
    )


def test_the_first_connection_starts_the_daemon_on_the_passed_socket(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    socket_path = run / "toold.sock"
    root = tmp_path / "root"
    root.mkdir()
    (root / "hello.txt").write_text("activated\n")
    (tmp_path / "state").mkdir()
    log = (tmp_path / "daemon.log").open("wb")
    assert ACTIVATE is not None
    activator = subprocess.Popen(
        [ACTIVATE, "-l", str(socket_path), "-E", "PATH",
         str(BIN / "toold"), "serve", "--root", str(root), "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not socket_path.exists():
            assert time.monotonic() < deadline and activator.poll() is None
            time.sleep(0.01)
        mode_before = socket_path.stat().st_mode
        pong = toolctl(socket_path, "ping", "--wait", "20")  # this connection starts the daemon
        assert pong.returncode == 0, pong.stderr + (tmp_path / "daemon.log").read_text()
        read = toolctl(socket_path, "call", "read_file", "--args", '{"path": "hello.txt"}')
        assert read.returncode == 0 and "activated" in read.stdout
        assert socket_path.stat().st_mode == mode_before  # the unit's mode, not re-moded
        assert not socket_path.with_name("toold.sock.lock").exists()  # the unit's socket needs no lock of ours
    finally:
        activator.terminate()
        activator.wait(timeout=20)
        log.close()
    assert socket_path.exists()  # the daemon (exec'd in the activator's place) never unlinks the unit's socket
    text = (tmp_path / "daemon.log").read_text()
    assert "Traceback" not in text, text
