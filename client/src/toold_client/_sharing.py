"""One connection used by several threads: turns at the socket, one inbox for all.

A ZeroMQ socket must never be used by two threads at once: libzmq then corrupts its
state, a thread may wait forever, and closing the socket can abort the whole process
(an assertion in libzmq). An editor that shares one ``Client`` between its threads must
get neither. So one thread at a time holds the socket; whichever thread is waiting for
something (a reply, a batch's next event) receives every frame that comes meanwhile and
files it in the shared inbox, and every waiting thread looks there after each frame. A
thread that has something to send wakes the receiving thread (``Transport.wake``), sends,
and gives the socket back, so a request never waits behind another thread's long wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ._errors import DaemonUnavailable
from ._inbox import Inbox
from ._transport import Transport

T = TypeVar("T")


class SharedConnection:
    def __init__(self, transport: Transport, inbox: Inbox) -> None:
        self._transport = transport
        self._inbox = inbox
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._receiving = False  # a thread is inside transport.recv, without the lock
        self._senders = 0  # threads waiting to send: the receiving thread lets them first
        self._closed = False
        self._waiting = 0  # threads in _wait: only then is there anyone to tell
        wake = getattr(transport, "wake", None)
        self._wake: Callable[[], None] | None = wake if callable(wake) else None

    def close(self) -> None:
        """Close the transport once no thread is inside it (one waiting is woken first)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._receiving:
                if self._wake is not None:
                    self._wake()
                self._wait(None)
            self._transport.close()
            self._tell()

    def _check_open(self) -> None:
        if self._closed:
            raise DaemonUnavailable("this client was closed")

    @contextmanager
    def inbox(self) -> Iterator[Inbox]:
        """The inbox, for changes no frame may come between."""
        with self._lock:
            yield self._inbox

    def send(self, frame: bytes) -> None:
        with self._lock:
            self._senders += 1
            try:
                while self._receiving:
                    if self._wake is not None:
                        self._wake()
                    self._wait(None)
                self._check_open()
                self._transport.send(frame)
            finally:
                self._senders -= 1
                self._tell()

    def wait_for(self, pick: Callable[[Inbox], T], timeout: float | None) -> T | None:
        """What ``pick`` finds in the inbox, receiving frames until it finds something;
        None once ``timeout`` seconds have passed (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                found = pick(self._inbox)
                if found is not None:
                    return found
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                if self._receiving or self._senders:
                    self._wait(remaining)  # told after each frame, and when the socket is free
                    continue
                self._check_open()
                frame = self._receive(remaining)
                if frame is not None:
                    self._inbox.deliver(frame)
                elif self._wake is None:  # such a transport returns nothing only when time is up
                    if remaining is None:
                        raise DaemonUnavailable("the daemon connection closed")
                    return None

    def _receive(self, timeout: float | None) -> bytes | None:
        """One frame, received without the lock (held on entry and on return). A transport
        that can be woken returns early, frame-less, when another thread wants to send."""
        self._receiving = True
        self._lock.release()
        try:
            return self._transport.recv(timeout)
        finally:
            self._lock.acquire()
            self._receiving = False
            self._tell()

    def _wait(self, timeout: float | None) -> None:
        self._waiting += 1
        try:
            self._turn.wait(timeout)
        finally:
            self._waiting -= 1

    def _tell(self) -> None:
        """Wake the threads waiting for a turn or a frame (a lone thread has none: the
        common case costs nothing)."""
        if self._waiting:
            self._turn.notify_all()
