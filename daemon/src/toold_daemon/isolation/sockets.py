"""Frames over the trio side of a Unix socket (the spawner's control socket, a zygote's):
send one with an fd attached, receive one whole. The peer process's end is in ``wire``.

Each use is a request and its one reply, so a frame is read with plain non-blocking
reads, waiting only while nothing is there: trio's socket methods take a trip through
the event loop for each read even when the bytes are already in (two per frame, on the
path of every command). A frame's length is bounded (``MAX_FRAME``, as on the other
side): a peer claiming more broke the framing."""

from __future__ import annotations

import array
import os
import socket

import trio

from .wire import MAX_FRAME

#: What one read asks for: a peer claiming a large frame gets room for it as it sends it.
_READ_AT_ONCE = 65536


class PeerGone(Exception):
    """The process at the other end closed the socket (it exited), or broke the framing."""


async def send_with_fd(sock: trio.socket.SocketType, data: bytes | bytearray, fd: int | list[int]) -> None:
    """``data`` with ``fd`` attached to its first byte: sent at once where the socket has
    room (nearly always), else as trio sends."""
    fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd] if isinstance(fd, int) else fd))]
    plain = socket.socket(sock.family, sock.type, sock.proto, sock.fileno())
    try:
        sent = plain.sendmsg([data], fds)
    except BlockingIOError:
        sent = await sock.sendmsg([data], fds)
    finally:
        plain.detach()  # the fd stays ``sock``'s
    while sent < len(data):
        sent += await sock.send(data[sent:])


async def receive_frame(sock: trio.socket.SocketType) -> bytes:
    header = await _receive_exact(sock, 4)
    return await _receive_exact(sock, _length(header))


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
    return await _receive_exact(sock, _length(header)), fds


def _length(header: bytes) -> int:
    size = int.from_bytes(header, "big")
    if size > MAX_FRAME:
        raise PeerGone(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return size


async def _receive_exact(sock: trio.socket.SocketType, size: int) -> bytes:
    """``size`` bytes, read as they are there."""
    parts = bytearray()
    while len(parts) < size:
        data = await read_when_ready(sock, min(size - len(parts), _READ_AT_ONCE))
        if not data:
            raise PeerGone
        parts += data
    return bytes(parts)


async def read_when_ready(sock: trio.socket.SocketType, size: int = _READ_AT_ONCE) -> bytes:
    """Up to ``size`` bytes of non-blocking ``sock`` (b"" at its end), with a plain read:
    the event loop is waited on only while there is nothing to read."""
    fd = sock.fileno()
    while True:
        try:
            return os.read(fd, size)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
