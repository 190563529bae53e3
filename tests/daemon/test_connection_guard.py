"""The connection guard against real sockets: counts per uid, sheds past the bounds, and
takes an fd that is closed, reused or not a socket at all without failing."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from toold_daemon.service.connections import ConnectionGuard, connection_budget


def listening(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    return server, path


def test_connections_past_the_per_uid_bound_are_shut_down(tmp_path: Path) -> None:
    server, path = listening(tmp_path)
    guard = ConnectionGuard(per_uid=2, total=10)
    guard.set_listen_path(os.fsencode(path))
    clients, accepted = [], []
    for _ in range(3):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        clients.append(client)
        conn, _ = server.accept()
        accepted.append(conn)
        guard.accepted(conn.fileno())
    assert guard.held_by(os.getuid()) == 2 and guard.shed == 1
    assert clients[2].recv(1) == b""  # the third was ended
    guard.disconnected(accepted[0].fileno())
    assert guard.held() == 1


def test_odd_fds_are_taken_without_failing(tmp_path: Path) -> None:
    guard = ConnectionGuard(per_uid=1, total=1)
    guard.set_listen_path(b"/nowhere")
    read_end, write_end = os.pipe()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a socket, but not one of ours
    try:
        for fd in (read_end, other.fileno(), 987_654, -1):
            guard.accepted(fd)
        assert guard.held() == 0 and guard.shed == 0
        guard.audit()
    finally:
        os.close(read_end)
        os.close(write_end)
        other.close()


def test_the_budget_keeps_a_reserve_of_descriptors() -> None:
    assert connection_budget(20_000, 8192) == 8192
    assert connection_budget(4096, 8192) == 4096 - 1024
    assert connection_budget(1024, 8192) == 16  # never nothing at all
