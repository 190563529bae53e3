"""sd_notify and the watchdog with a real daemon and a NOTIFY_SOCKET the test binds."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import start_daemon
from toold_client import APPROVE_ALL


class Listener:
    """What systemd would receive: every datagram, with its arrival time."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.received: list[tuple[float, str]] = []

    def until(self, field: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, message in self.received:
                if field in message.split("\n"):
                    return message
            try:
                self.received.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                pass
        raise AssertionError(f"no {field} within {timeout}s; got {[m for _, m in self.received]}")

    def collect(self, seconds: float) -> list[str]:
        self.received.clear()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.received.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                pass
        return [m for _, m in self.received]


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_status_watchdog_reload_and_stopping(tmp_path: Path, root: Path, abstract: bool) -> None:
    address = f"@toold-test-{secrets.token_hex(6)}" if abstract else str(tmp_path / "notify.sock")
    listener = Listener(address)
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"}
    d = start_daemon(tmp_path, root, env=env)
    try:
        assert "STATUS=recovering the journal" in listener.until("STATUS=recovering the journal")
        ready = listener.until("READY=1")
        assert "STATUS=serving 0 sessions, 0 running batches" in ready.split("\n")
        pings = [m for m in listener.collect(1.2) if "WATCHDOG=1" in m.split("\n")]
        assert 4 <= len(pings) <= 9, pings  # every 0.2 s
        with d.client() as client:
            client.ping()
            assert "serving 1 sessions" in listener.until("STATUS=serving 1 sessions, 0 running batches")
        listener.received.clear()
        os.kill(d.proc.pid, signal.SIGHUP)
        reloading = listener.until("RELOADING=1")
        assert any(f.startswith("MONOTONIC_USEC=") and int(f.split("=")[1]) > 0 for f in reloading.split("\n"))
        listener.until("READY=1")
        d.stop()
        assert "STOPPING=1" in listener.until("STOPPING=1")
    finally:
        if d.proc.poll() is None:
            d.stop()
        listener.sock.close()


def test_a_watchdog_meant_for_another_process_is_ignored_and_nothing_leaks_to_tools(tmp_path: Path, root: Path) -> None:
    address = str(tmp_path / "notify.sock")
    listener = Listener(address)
    d = start_daemon(tmp_path, root, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"})
    try:
        listener.until("READY=1")
        assert not [m for m in listener.collect(0.8) if "WATCHDOG=1" in m.split("\n")]
        with d.client() as client:
            code = {"language": "python", "code": "import os; print(sorted(os.environ))"}
            env = client.call("run_code", code, on_confirm=lambda r: APPROVE_ALL, timeout=60)
        assert env.ok, env.content
        assert "NOTIFY_SOCKET" not in env.content and "WATCHDOG" not in env.content
    finally:
        d.stop()
        listener.sock.close()
