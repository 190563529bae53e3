"""Moving a proxied connection's bytes both ways, counted against the call's budget.

Where it can, a direction runs in a thread of its own that waits with ``poll`` and
moves the bytes in a tight loop: a transfer then costs two system calls per chunk, not a
trip through the event loop for every wait. A thread reads into a buffer of its own
(``THREAD_BUFFER_BYTES``, mapped once per thread and kept for the next direction it
runs, its pages touched only as far as transfers fill them) and writes from it: on
loopback, whatever the socket holds comes out in one read and goes on in one write.
That costs less than ``splice`` through a pipe, which takes what the socket holds a
few pages at a time (here: 0.04-0.14 against 0.18-0.32 ms a MB over a direct transfer's
0.3). The threads come from trio's cache, where a finished direction's thread waits a
while for the next one. There are only so many such threads (``RELAY_THREADS``
directions at once, and a process limit may refuse a thread); a connection that finds
none free relays on the event loop instead, with ``splice`` (no copy on the loop),
slower and otherwise the same.

Either way: the end of one direction is passed on as a half close; a broken side or a
spent budget ends both directions; cancelling the relay (the call is over) shuts both
sockets down, which wakes a waiting thread, and returns only once the threads are done
with the descriptors (a descriptor closed under a running thread could be reused).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import mmap
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import trio

if TYPE_CHECKING:
    import outcome  # trio's own dependency: what a thread's deliver callback is given

#: Directions relayed by threads at once (two per connection); the rest use the event loop.
RELAY_THREADS = 64
#: What a relaying thread reads at most at once (its buffer, kept while the thread lives).
THREAD_BUFFER_BYTES = 1024 * 1024
_SMALL_BUFFER_BYTES = 64 * 1024  # a thread's buffer when the mapping is refused
_PIPE_BYTES = 1024 * 1024  # the pipe a direction on the event loop moves through
_SPLICE_MOVE, _SPLICE_NONBLOCK = 1, 2
_F_SETPIPE_SZ = 1031
_BUDGET_WAIT_SECONDS = 0.001  # while another direction holds the rest of the budget

#: How a direction ended: the source's end of stream, a spent budget, a broken side.
Ending = Literal["eof", "budget", "broken"]

_threads = trio.CapacityLimiter(RELAY_THREADS)
log = logging.getLogger(__name__)


class Budget:
    """Bytes a call may still move through the proxy, both ways together, shared by the
    call's connections and their threads. A direction reserves before it moves (at most
    what is left) and settles after; a reservation held by another direction is not
    spent yet, so a direction that finds nothing left but reservations open waits."""

    def __init__(self, remaining: int) -> None:
        self._remaining = remaining
        self._reserved = 0
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return self._remaining

    def reserve(self, most: int) -> int | None:
        """Up to ``most`` bytes; 0 when the budget is spent, None while others hold the rest."""
        with self._lock:
            if self._remaining <= 0:
                return None if self._reserved else 0
            granted = min(most, self._remaining)
            self._remaining -= granted
            self._reserved += granted
            return granted

    def settle(self, granted: int, used: int) -> None:
        with self._lock:
            self._reserved -= granted
            self._remaining += granted - used

    def spend(self, count: int) -> bool:
        """Spend ``count`` bytes already moved; False if that went past the budget."""
        with self._lock:
            self._remaining -= count
            return self._remaining >= 0


async def relay(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    budget: Budget,
    count: Callable[[bool, int], None],
    spent: Callable[[], None] = lambda: None,
) -> Ending:
    """Relay until both directions end; ``count(outbound, n)`` is told of every move, and
    ``spent()`` at once when the budget ends the relay (even if it is cancelled after).
    Returns ``"budget"`` if the budget ended it, ``"broken"`` for a broken side."""
    try:
        _threads.acquire_on_behalf_of_nowait(client)
    except trio.WouldBlock:
        return await _relay_on_loop(client, upstream, budget, count, spent)
    try:
        _threads.acquire_on_behalf_of_nowait(upstream)
    except trio.WouldBlock:
        _threads.release_on_behalf_of(client)
        return await _relay_on_loop(client, upstream, budget, count, spent)
    try:
        return await _relay_in_threads(client, upstream, budget, count, spent)
    finally:
        _threads.release_on_behalf_of(client)
        _threads.release_on_behalf_of(upstream)


async def _relay_on_loop(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    budget: Budget,
    count: Callable[[bool, int], None],
    spent: Callable[[], None],
) -> Ending:
    """The event-loop path; like the threads, it shuts both sockets down when it ends
    other than by both ends of stream (or is cancelled), so both peers see the end."""
    fds = (client.socket.fileno(), upstream.socket.fileno())
    ending: Ending = "broken"
    try:
        ending = await _both_ways_on_loop(client, upstream, budget, count, spent)
        return ending
    finally:
        if ending != "eof":
            _shut_down(fds)


# ---- in threads -----------------------------------------------------------------------------


async def _relay_in_threads(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    budget: Budget,
    count: Callable[[bool, int], None],
    spent: Callable[[], None],
) -> Ending:
    fds = (client.socket.fileno(), upstream.socket.fileno())
    for stream in (client, upstream):
        _unthrottle(stream)
    endings: list[Ending] = []
    finished = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def direction(source: int, sink: int, outbound: bool) -> None:
        ending: Ending = "broken"  # unless it ends otherwise: the relay must always learn of the end
        try:
            ending = _pump_blocking(source, sink, budget, lambda moved: count(outbound, moved))
            if ending == "budget":
                spent()
        finally:
            if ending != "eof":
                _shut_down(fds)  # ends the other direction too
            endings.append(ending)
            if len(endings) == 2:
                token.run_sync_soon(finished.set)

    started = 0
    try:
        for source, sink, outbound in ((fds[0], fds[1], True), (fds[1], fds[0], False)):
            # trio's thread cache: an idle thread takes the direction (~35 µs) instead of a
            # new thread starting for it (~115 µs), which every connection's first byte waits on
            trio.lowlevel.start_thread_soon(functools.partial(direction, source, sink, outbound), _report_failure)
            started += 1
    except RuntimeError:  # a process limit refused the thread
        if not started:
            return await _relay_on_loop(client, upstream, budget, count, spent)
        _shut_down(fds)
        endings.append("broken")
        if len(endings) == 2:
            finished.set()
    try:
        await finished.wait()
    finally:
        if not finished.is_set():  # cancelled: wake the threads, wait until they let go
            _shut_down(fds)
            with trio.CancelScope(shield=True):
                await finished.wait()
    return _worst(endings)


def _report_failure(result: outcome.Outcome[None]) -> None:
    """A direction's thread ended: it returns nothing, so only an exception is news."""
    try:
        result.unwrap()
    except Exception:
        log.exception("a relay direction failed")


def _pump_blocking(source: int, sink: int, budget: Budget, moved: Callable[[int], None]) -> Ending:
    """One direction in a thread: wait for data with ``poll``, reserve budget for it,
    read it into the thread's buffer and write it on."""
    buffer = _thread_buffer()
    readable, writable = select.poll(), select.poll()
    readable.register(source, select.POLLIN)
    writable.register(sink, select.POLLOUT)
    while True:
        readable.poll()
        granted = budget.reserve(len(buffer))
        if granted is None:
            time.sleep(_BUDGET_WAIT_SECONDS)
            continue
        if not granted:
            return "budget"
        try:
            got = os.readv(source, [buffer[:granted]])
        except BlockingIOError:
            budget.settle(granted, 0)
            continue
        except OSError:
            budget.settle(granted, 0)
            return "broken"
        budget.settle(granted, got)
        if got == 0:
            _half_close(sink)
            return "eof"
        sent = 0
        while sent < got:
            try:
                sent += os.write(sink, buffer[sent:got])
            except BlockingIOError:
                writable.poll()
            except OSError:
                return "broken"
        moved(got)


_thread_state = threading.local()


def _thread_buffer() -> memoryview:
    """This thread's buffer: an anonymous mapping, so that pages no transfer reached cost
    no memory (a thread that only ever relays small requests uses a page or two)."""
    buffer: memoryview | None = getattr(_thread_state, "buffer", None)
    if buffer is None:
        try:
            buffer = memoryview(mmap.mmap(-1, THREAD_BUFFER_BYTES))
        except OSError:  # out of address space (the process's limit): a small one will do
            buffer = memoryview(bytearray(_SMALL_BUFFER_BYTES))
        _thread_state.buffer = buffer
    return buffer


# ---- on the event loop ----------------------------------------------------------------------


async def _both_ways_on_loop(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    budget: Budget,
    count: Callable[[bool, int], None],
    spent: Callable[[], None],
) -> Ending:
    endings: list[Ending] = []
    async with trio.open_nursery() as nursery:

        async def direction(source: trio.SocketStream, sink: trio.SocketStream, outbound: bool) -> None:
            try:
                ending = await _pump_on_loop(source, sink, budget, lambda moved: count(outbound, moved))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                ending = "broken"
            endings.append(ending)
            if ending == "budget":
                spent()
            if ending != "eof":
                nursery.cancel_scope.cancel()

        nursery.start_soon(direction, client, upstream, True)
        nursery.start_soon(direction, upstream, client, False)
    return _worst(endings)


async def _pump_on_loop(
    source: trio.SocketStream, sink: trio.SocketStream, budget: Budget, moved: Callable[[int], None]
) -> Ending:
    reader, writer, capacity = _pipe()
    flags = _SPLICE_NONBLOCK | _SPLICE_MOVE
    src, dst = source.socket.fileno(), sink.socket.fileno()
    try:
        while True:
            await trio.lowlevel.wait_readable(src)
            granted = budget.reserve(capacity)
            if granted is None:
                await trio.sleep(_BUDGET_WAIT_SECONDS)
                continue
            if not granted:
                return "budget"
            try:
                got = os.splice(src, writer, granted, flags=flags)
            except BlockingIOError:
                budget.settle(granted, 0)
                continue
            budget.settle(granted, got)
            if got == 0:
                await sink.send_eof()
                return "eof"
            left = got
            while left:
                try:
                    left -= os.splice(reader, dst, left, flags=flags)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(dst)
            moved(got)
    finally:
        os.close(reader)
        os.close(writer)


# ---- small pieces ---------------------------------------------------------------------------


def _pipe() -> tuple[int, int, int]:
    reader, writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        capacity = fcntl.fcntl(writer, _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:  # above /proc/sys/fs/pipe-max-size for an unprivileged user
        capacity = 64 * 1024
    return reader, writer, capacity


def _unthrottle(stream: trio.SocketStream) -> None:
    """Let a socket queue as much unsent data as its buffer holds: trio's small
    ``TCP_NOTSENT_LOWAT`` suits interactive streams, but makes a relay wait on every
    16 KiB."""
    try:
        stream.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, -1)  # unlimited
    except (OSError, AttributeError):
        pass


def _half_close(fd: int) -> None:
    try:
        _shutdown(fd, socket.SHUT_WR)
    except OSError:
        pass


def _shut_down(fds: tuple[int, int]) -> None:
    for fd in fds:
        try:
            _shutdown(fd, socket.SHUT_RDWR)
        except OSError:
            pass


def _shutdown(fd: int, how: int) -> None:
    """``shutdown(2)`` on a bare descriptor (the socket object stays the event loop's)."""
    probe = socket.socket(fileno=fd)
    try:
        probe.shutdown(how)
    finally:
        probe.detach()


def _worst(endings: list[Ending]) -> Ending:
    if "budget" in endings:
        return "budget"
    return "broken" if "broken" in endings else "eof"
