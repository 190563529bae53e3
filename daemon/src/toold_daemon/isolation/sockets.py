"""Frames over the trio side of a Unix socket (the spawner's control socket, a zygote's):
send one with an fd attached, receive one whole. The peer process's end is in ``wire``."""

from __future__ import annotations

import array
import socket

import trio


class PeerGone(Exception):
    """The process at the other end closed the socket (it exited)."""


async def send_with_fd(sock: trio.socket.SocketType, data: bytes, fd: int | list[int]) -> None:
    fds = [fd] if isinstance(fd, int) else fd
    sent = await sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    while sent < len(data):
        sent += await sock.send(data[sent:])


async def receive_frame(sock: trio.socket.SocketType) -> bytes:
    header = await _receive_exact(sock, 4)
    return await _receive_exact(sock, int.from_bytes(header, "big"))


async def _receive_exact(sock: trio.socket.SocketType, size: int) -> bytes:
    parts = bytearray()
    while len(parts) < size:
        data = await sock.recv(size - len(parts))
        if not data:
            raise PeerGone
        parts += data
    return bytes(parts)
