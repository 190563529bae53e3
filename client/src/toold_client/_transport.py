"""The transport seam: how frames move between this client and a daemon.

``Client`` only needs ``send`` and ``recv``; tests of client logic use an in-memory
transport, while integration tests and real use go through :class:`ZmqTransport`.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from typing import Protocol, cast

import zmq

from ._errors import DaemonUnavailable, Refused


class Transport(Protocol):
    """What a ``Client`` sends and receives through. A transport may also have ``wake()``
    (thread-safe): a ``recv`` in progress in another thread then returns None at once,
    so that a thread sharing the client can send without waiting for it."""

    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout: float | None) -> bytes | None:
        """The next frame, or None if none arrived within ``timeout`` seconds (None: wait forever)."""
        ...

    def close(self) -> None: ...


#: ZeroMQ heartbeats: a daemon that stops answering them (stopped, or its host gone) is
#: disconnected after the timeout; a daemon that dies closes the connection at once.
HEARTBEAT_INTERVAL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 3000


class ZmqTransport:
    """A DEALER socket connected to the daemon's ROUTER. While waiting for a frame it also
    watches the connection (a socket monitor): if the daemon goes away, ``recv`` fails
    with DaemonUnavailable instead of waiting forever."""

    def __init__(self, endpoint: str) -> None:
        if not endpoint.startswith("ipc://"):
            # ZeroMQ would retry a TCP address in silence until the request timed out
            raise DaemonUnavailable(f"cannot reach {endpoint!r}: toold serves only ipc:// endpoints (a Unix socket)")
        _probe(endpoint)
        # ``wake``: a byte here ends a ``recv`` in progress (another thread wants the socket)
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        self._sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_INTERVAL_MS)
        self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._refused = ""  # why the daemon turned this client away, once it has
        self._down = False  # disconnected, and not connected again since
        self._unfinished = False  # a handshake failed without a word: see _disconnected
        self._monitor: zmq.Socket[bytes] | None = self._sock.get_monitor_socket(_WATCHED_EVENTS)
        self._endpoint = endpoint
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise DaemonUnavailable(f"cannot connect to {endpoint}: {exc}") from None
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._poller.register(self._wake_read, zmq.POLLIN)

    def wake(self) -> None:
        """End a ``recv`` in progress in another thread (it returns None); thread-safe."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"\0")

    def send(self, frame: bytes) -> None:
        self._forget_old_disconnects()  # a daemon restarted since: this frame goes to the new one
        if self._refused:
            raise Refused(self._refused)
        if self._down:
            # The daemon went away since the last frame. Restarted (its socket answers),
            # ZeroMQ reconnects and delivers this frame; gone, say so now, not once the
            # request has timed out.
            _probe(self._endpoint)
        try:
            self._sock.send(frame)
        except zmq.ZMQError as exc:
            raise DaemonUnavailable(f"cannot send to the daemon: {exc}") from None

    def recv(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        try:
            while True:
                wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                ready = dict(self._poller.poll(wait))
                if self._sock in ready:
                    return self._sock.recv()
                if self._wake_read in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_read, 4096)
                    return None
                if self._monitor is not None and self._monitor in ready and self._disconnected():
                    if self._refused:
                        raise Refused(self._refused)
                    raise DaemonUnavailable(
                        f"the daemon at {self._endpoint} went away while this client waited "
                        "(connection closed or heartbeats unanswered)"
                    )
                if deadline is not None and time.monotonic() >= deadline:
                    return None
        except zmq.ZMQError as exc:
            raise DaemonUnavailable(f"cannot receive from the daemon: {exc}") from None

    def try_recv(self) -> bytes | None:
        """A frame if one is waiting, else None, without blocking (for event loops, which
        wait on ``fds()`` becoming readable in between). DaemonUnavailable if the daemon went away."""
        try:
            if _has_input(self._sock):
                return self._sock.recv(zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise DaemonUnavailable(f"cannot receive from the daemon: {exc}") from None
        if self._monitor is not None and _has_input(self._monitor) and self._disconnected():
            if self._refused:
                raise Refused(self._refused)
            raise DaemonUnavailable(f"the daemon at {self._endpoint} went away (connection closed)")
        return None

    def fds(self) -> list[int]:
        """File descriptors that become readable when ``try_recv`` may have news. ZeroMQ's
        are edge-triggered: call ``try_recv`` until None before waiting on them again."""
        fds = [cast(int, self._sock.getsockopt(zmq.FD))]
        if self._monitor is not None:
            fds.append(cast(int, self._monitor.getsockopt(zmq.FD)))
        return fds

    def _disconnected(self) -> bool:
        """Read the monitor's pending events: was the connection closed, or refused by
        the daemon's authentication (then ``_refused`` says so, for good)?

        A handshake that did not finish (``HANDSHAKE_FAILED_NO_DETAIL``, then a
        disconnect) is neither: a daemon too busy to authenticate a new connection within
        its handshake time closes it, and ZeroMQ connects again. It counts as closed only
        when nothing listens on the socket any more."""
        assert self._monitor is not None
        closed = False
        while _has_input(self._monitor):  # cheaper than poll(0), which builds a poller
            event = _monitor_event(self._monitor)
            if event in _REFUSALS:
                self._refused = (
                    f"the daemon at {self._endpoint} refused this client: its authentication turned "
                    "this user away (the daemon's allowed_uids / allowed_gids, or a tool process's socket)"
                )
            if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self._unfinished = True
            elif event == zmq.EVENT_CONNECTED:
                self._down = False
            elif event == zmq.EVENT_DISCONNECTED or event in _REFUSALS:
                self._down = True
                closed = closed or self._refused != "" or not self._unfinished or not self._listening()
                self._unfinished = False
        return closed

    def _listening(self) -> bool:
        try:
            _probe(self._endpoint)
        except DaemonUnavailable:
            return False
        return True

    def _forget_old_disconnects(self) -> None:
        if self._monitor is not None:
            self._disconnected()

    def close(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self._sock.close(linger=0)
        self._ctx.term()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)


#: For good: the daemon's authentication said no (AUTH), or the peer speaks something else.
_REFUSALS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_WATCHED_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | sum(_REFUSALS)


def _probe(endpoint: str) -> None:
    """Say at once why a Unix socket cannot be reached, where ZeroMQ would retry in
    silence: no socket there, no permission, or nobody listening (a daemon that died)."""
    import errno
    import socket

    path = endpoint.removeprefix("ipc://")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)  # a full backlog (a flood) answers EAGAIN at once: never wait here
    try:
        probe.connect(path)
    except FileNotFoundError:
        raise DaemonUnavailable(f"no daemon socket at {endpoint}") from None
    except PermissionError:
        raise DaemonUnavailable(
            f"permission denied for {path}: this user may not reach the daemon's socket "
            "(the socket's group or mode; the daemon's socket_group and socket_mode)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            why = "a socket left by a daemon that stopped"
            raise DaemonUnavailable(f"no daemon is listening at {endpoint} ({why})") from None
        busy = isinstance(exc, TimeoutError) or exc.errno in (errno.EAGAIN, errno.EINPROGRESS, errno.ETIMEDOUT)
        if not busy:  # a full backlog is left to ZeroMQ, which waits for room
            raise DaemonUnavailable(f"cannot connect to {endpoint}: {exc.strerror}") from None
    finally:
        probe.close()


def _monitor_event(monitor: zmq.Socket[bytes]) -> int:
    """The next event's id from a socket monitor (libzmq's format: a frame of a 16-bit id
    and a 32-bit value, then the endpoint). pyzmq's own reader imports asyncio (~25 ms of
    every toolctl start)."""
    frames = monitor.recv_multipart()
    return int(struct.unpack_from("=h", frames[0])[0])


#: An int, not pyzmq's flag: ``int & flag`` runs the flag's Python-level ``__rand__``.
_POLLIN = int(zmq.POLLIN)


def _has_input(sock: zmq.Socket[bytes]) -> bool:
    return bool(int(sock.getsockopt(zmq.EVENTS)) & _POLLIN)
