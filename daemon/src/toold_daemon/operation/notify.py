"""Telling systemd how the daemon is doing: ``sd_notify`` without libsystemd.

A few ``KEY=value`` lines in one datagram to the ``AF_UNIX`` socket named by
``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract address): ``READY=1`` once
the socket serves and the journal's recovery is done, ``STATUS=`` lines,
``RELOADING=1`` … ``READY=1`` around a policy reload, ``STOPPING=1`` on shutdown, and
``WATCHDOG=1`` every half ``WATCHDOG_USEC`` from a task of the event loop itself, so a
stalled loop stops the pings and systemd restarts the daemon. Without
``NOTIFY_SOCKET`` every call does nothing. The variables are removed from the
environment once read: nothing the daemon starts should talk to systemd as it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

import trio

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str = "", watchdog_seconds: float | None = None) -> None:
        self.address = address
        self.watchdog_seconds = watchdog_seconds
        self._sock: socket.socket | None = None
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """Read (and remove) ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``."""
        env = os.environ if environ is None else environ
        address = env.pop("NOTIFY_SOCKET", "")
        usec = env.pop("WATCHDOG_USEC", "")
        pid = env.pop("WATCHDOG_PID", "")
        watchdog = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog = int(usec) / 1_000_000
        if address and not (address.startswith(("/", "@"))):
            log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract address; not notifying", address)
            address = ""
        return cls(address, watchdog)

    @property
    def active(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str) -> bool:
        """One datagram of ``fields`` (``KEY=value``); False if it could not be sent."""
        if self._sock is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            self._sock.sendto("\n".join(fields).encode(), target)
        except OSError as exc:
            log.debug("sd_notify to %s failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def reloading(self) -> bool:
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}", "STATUS=reloading the policy")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    async def keep_alive(self, describe: Callable[[], str], status_every: float = 5.0) -> None:
        """Forever: ``WATCHDOG=1`` every half watchdog interval (when systemd asked for
        one), and a fresh ``STATUS=`` line when it changed, at most every ``status_every``."""
        if self._sock is None:
            return
        interval = self.watchdog_seconds / 2 if self.watchdog_seconds else status_every
        last_status, last_sent = "", 0.0
        while True:
            fields = ["WATCHDOG=1"] if self.watchdog_seconds else []
            now = time.monotonic()
            status = describe()
            if status != last_status and now - last_sent >= min(status_every, interval):
                fields.append(f"STATUS={status}")
                last_status, last_sent = status, now
            if fields:
                self.send(*fields)
            await trio.sleep(min(interval, status_every))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
