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


async def receive_frame_with_fds(sock: trio.socket.SocketType) -> tuple[bytes, list[int]]:
    """One frame, with the fds attached to its first bytes (SCM_RIGHTS)."""
    data, ancillary, _flags, _address = await sock.recvmsg(4, socket.CMSG_SPACE(4 * array.array("i").itemsize * 4))
    if not data:
        raise PeerGone
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    header = data + (await _receive_exact(sock, 4 - len(data)) if len(data) < 4 else b"")
    return await _receive_exact(sock, int.from_bytes(header, "big")), fds


async def _receive_exact(sock: trio.socket.SocketType, size: int) -> bytes:
    parts = bytearray()
    while len(parts) < size:
        data = await sock.recv(size - len(parts))
        if not data:
            raise PeerGone
        parts += data
    return bytes(parts)
