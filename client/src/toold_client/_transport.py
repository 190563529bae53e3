"""The transport seam: how frames move between this client and a daemon.

``Client`` only needs ``send`` and ``recv``; tests of client logic use an in-memory
transport, while integration tests and real use go through :class:`ZmqTransport`.
"""

from __future__ import annotations

from typing import Protocol

import zmq

from ._errors import DaemonUnavailable


class Transport(Protocol):
    def send(self, frame: bytes) -> None: ...

    def recv(self, timeout: float | None) -> bytes | None:
        """The next frame, or None if none arrived within ``timeout`` seconds (None: wait forever)."""
        ...

    def close(self) -> None: ...


class ZmqTransport:
    """A DEALER socket connected to the daemon's ROUTER."""

    def __init__(self, endpoint: str) -> None:
        if endpoint.startswith("ipc://"):
            import os

            if not os.path.exists(endpoint.removeprefix("ipc://")):
                raise DaemonUnavailable(f"no daemon socket at {endpoint}")
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        try:
            self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise DaemonUnavailable(f"cannot connect to {endpoint}: {exc}") from None
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)

    def send(self, frame: bytes) -> None:
        try:
            self._sock.send(frame)
        except zmq.ZMQError as exc:
            raise DaemonUnavailable(f"cannot send to the daemon: {exc}") from None

    def recv(self, timeout: float | None) -> bytes | None:
        try:
            if timeout is not None and not self._poller.poll(max(0, int(timeout * 1000))):
                return None
            return self._sock.recv()
        except zmq.ZMQError as exc:
            raise DaemonUnavailable(f"cannot receive from the daemon: {exc}") from None

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
