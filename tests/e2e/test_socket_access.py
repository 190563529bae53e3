"""``[daemon] socket_group`` and ``socket_mode``: a daemon started by hand as root (no
socket unit) makes its socket reachable as the unit would: the group's members connect,
others are refused by the kernel, and the socket's directory lets only the group pass."""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, DaemonProcess, start_daemon, wait_ready
from tests.e2e.test_identity import OTHER_GID, OTHER_UID
from toold_client import Client, DaemonUnavailable

NOBODY = 65534


@pytest.fixture
def grouped_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a daemon for other users")
    shared = Path(tempfile.mkdtemp(prefix="toold-group-"))
    os.chmod(shared, 0o711)
    root = shared / "workspace"
    root.mkdir(mode=0o755)
    group = grp.getgrgid(OTHER_GID).gr_name
    config = f'[daemon]\nsocket_group = "{group}"\nsocket_mode = 0o660\n'
    d = start_daemon(tmp_path, root, socket_dir=shared / "run", config=config)
    try:
        wait_ready(d)
        yield d
    finally:
        d.stop()
        shutil.rmtree(shared, ignore_errors=True)


def ping_as(uid: int, gid: int, endpoint: str) -> dict[str, object]:
    """Fork, become ``uid``/``gid`` (no other groups), ping; what happened."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        report: dict[str, object] = {}
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            started = time.monotonic()
            try:
                with Client(endpoint, timeout=10) as c:
                    c.ping(timeout=10)
                report["ok"] = True
            except DaemonUnavailable as exc:
                report["error"] = str(exc)
            report["took"] = time.monotonic() - started
        finally:
            os.write(write_end, json.dumps(report).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)  # type: ignore[no-any-return]


def test_members_of_the_socket_group_connect_and_others_are_refused(grouped_daemon: DaemonProcess) -> None:
    sock = os.stat(grouped_daemon.socket)
    assert sock.st_gid == OTHER_GID and stat.S_IMODE(sock.st_mode) == 0o660
    directory = os.stat(grouped_daemon.socket.parent)
    assert directory.st_gid == OTHER_GID and stat.S_IMODE(directory.st_mode) == 0o710
    member = ping_as(OTHER_UID, OTHER_GID, grouped_daemon.endpoint)
    assert member.get("ok") is True, member
    stranger = ping_as(NOBODY, NOBODY, grouped_daemon.endpoint)
    assert "ok" not in stranger and "permission denied" in str(stranger.get("error")), stranger
    assert float(stranger["took"]) < 1  # type: ignore[arg-type]


def test_a_socket_group_that_does_not_exist_stops_the_start(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(RuntimeError, match="no group 'no-such-group-here'"):
        d = start_daemon(tmp_path, root, config='[daemon]\nsocket_group = "no-such-group-here"\n')
        try:
            wait_ready(d)
        finally:
            d.stop()


def test_a_socket_mode_with_execute_bits_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[daemon]\nsocket_mode = 0o661\n")
    checked = subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode != 0 and "socket_mode" in checked.stdout + checked.stderr
