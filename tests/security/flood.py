"""A local user who opens connections to the daemon's socket and never uses them.

``main(SOCKET, COUNT, MODE)`` opens COUNT connections (MODE ``half``: connect only;
``silent``: also send ZeroMQ's greeting and READY as a DEALER would, then say nothing),
prints how many it opened and how many the daemon has closed since (counted until a
second passes without another closing: a daemon busy with four floods at once reaches
the last of them late), then holds them until killed.
"""

from __future__ import annotations

import resource
import select
import socket
import time

GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def ready_command() -> bytes:
    name, value = b"Socket-Type", b"DEALER"
    body = b"\x05READY" + bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value
    return b"\x04" + bytes([len(body)]) + body


def open_connections(path: str, count: int, mode: str) -> list[socket.socket]:
    held: list[socket.socket] = []
    deadline = time.monotonic() + 60
    while len(held) < count and time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(2)
            sock.connect(path)
            if mode == "silent":
                sock.sendall(GREETING + ready_command())
        except OSError:
            sock.close()
            time.sleep(0.01)
            continue
        sock.setblocking(False)
        held.append(sock)
    return held


def closed_by_peer(held: list[socket.socket]) -> set[int]:
    """The descriptors of ``held`` the daemon has closed (end of stream, or reset)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in held}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    closed = set()
    for fd, _events in poller.poll(0):
        try:
            while by_fd[fd].recv(65536):
                pass
            closed.add(fd)
        except BlockingIOError:
            pass
        except OSError:
            closed.add(fd)
    return closed


def closed_once_settled(held: list[socket.socket], *, quiet: float = 1.0, most: float = 20.0) -> int:
    """How many of ``held`` the daemon closes, counted until ``quiet`` seconds pass with
    no more (or ``most`` in all)."""
    closed: set[int] = set()
    last_change = started = time.monotonic()
    while time.monotonic() - last_change < quiet and time.monotonic() - started < most:
        time.sleep(0.1)
        newly = closed_by_peer([sock for sock in held if sock.fileno() not in closed])
        if newly:
            closed |= newly
            last_change = time.monotonic()
    return len(closed)


def main(path: str, count: int, mode: str) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = open_connections(path, count, mode)
    print(f"opened {len(held)} closed {closed_once_settled(held)}", flush=True)
    time.sleep(3600)
