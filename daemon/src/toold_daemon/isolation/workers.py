"""The trio side of tool workers (see ``worker``): a bounded pool, per kind of call.

A kind is everything a worker's confinement and sandbox depend on: uid, gid, roots,
the configuration and the required layers. A call takes an idle worker of its kind, or
starts one through the spawner (a fork of an already-warm process, then confinement:
a few milliseconds, once), sends one frame and reads frames back until the outcome.
The worker goes back to the pool only after a clean outcome: a call that is cancelled or
times out, or whose worker dies or sends garbage, ends that worker (SIGKILL to its
cgroup and pid), and the next call of that kind gets a fresh one.

At most ``max_workers`` live at once; when a new kind needs room, the least recently
used idle worker is retired; when none is idle, the call waits for one. One uid's calls
hold at most ``max_per_uid`` workers at once (busy ones; its idle ones are retired for
others like any): a user whose calls are slow, by chance or on purpose, waits for their
own workers and leaves the rest to everyone else. Workers idle for ``idle_seconds``
exit, and so does a worker after ``MAX_CALLS`` calls or ``MAX_AGE_S`` seconds (its
CPU-time rlimit counts across calls).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import select
import signal
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec
import trio

from ..pool_shares import per_uid_share
from .cgroup import Cgroups, CgroupUnavailable
from .sockets import PeerGone, read_when_ready, receive_frame
from .wire import MAX_FRAME, Chunk, FrameBuffer, Outcome, SpawnRequest, child_decoder, frame
from .worker import STALE

log = logging.getLogger(__name__)
MAX_CALLS = 10_000
MAX_AGE_S = 600.0
_READY_TIMEOUT_S = 10.0
#: How long an abandoned call's outcome is waited for before its worker is ended instead.
ABANDONED_SECONDS = 2.0

Kind = tuple[int, int, tuple[str, ...], int, tuple[str, ...]]
# (request for the worker itself, its socket end to hand over) -> the worker's pid
StartChild = Callable[[SpawnRequest, int], Awaitable[int]]
OnChunk = Callable[[Chunk], None]


class WorkerFailed(Exception):
    """The worker died mid-call or broke the protocol (the message says which); the call
    gets an error result and the next call a fresh worker."""


class WorkerUnavailable(Exception):
    """No worker could be started (a required layer is off, the spawner is gone ...)."""


def kind_of(request: SpawnRequest, config_generation: int) -> Kind:
    return (request.uid, request.gid, tuple(request.roots), config_generation, tuple(request.require))


#: The most bytes one write to a worker hands the kernel. A write to a non-blocking socket
#: goes on for as long as the worker drains it on the other CPU: one write of an undo's
#: 60 MB request held the loop, and every other client, for 200 ms.
WRITE_PIECE = 256 << 10


class Worker(msgspec.Struct, eq=False):
    pid: int
    sock: trio.socket.SocketType
    kind: Kind
    cgroup: str  # its own cgroup ("" without cgroups)
    layers: dict[str, str] = msgspec.field(default_factory=dict)
    roots: list[str] = msgspec.field(default_factory=list)  # canonical, as its sandbox has them
    born: float = msgspec.field(default_factory=time.monotonic)
    last_used: float = msgspec.field(default_factory=time.monotonic)
    calls: int = 0
    buffer: FrameBuffer = msgspec.field(default_factory=FrameBuffer)
    busy: bool = False  # taken for a call (counted against its uid) until given back or ended

    @property
    def uid(self) -> int:
        return self.kind[0]

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        """All of ``data`` (a request, or what a begun call's first write left), a piece
        at a time (``WRITE_PIECE``), with plain non-blocking writes: the event loop is
        waited on only while the socket is full, and yielded to between the pieces of a
        large request. (trio's ``send`` takes a trip through the loop after every write,
        even one that went out at once: under load, a scheduler round per call.)"""
        view = memoryview(data)
        fd = self.sock.fileno()
        while view:
            try:
                sent = os.write(fd, view[:WRITE_PIECE])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
                continue
            view = view[sent:]
            if view:
                await trio.lowlevel.checkpoint()  # the rest of a large request: others first

    async def receive(self, spin: float = 0.0) -> Chunk | Outcome:
        """The worker's next message (one read usually brings a whole frame), read with
        plain non-blocking reads as ``send`` writes. ``spin``: first poll for it this long
        without yielding (see ``SPIN_SECONDS``).

        The worker runs as the client, who can make it say anything: each streamed chunk,
        and each further piece of a message, leaves the other tasks a turn first, or a
        worker streaming faster than it is read would hold the loop (the outcome, a call's
        last message, is returned at once)."""
        fd = self.sock.fileno()
        pieces = 0
        while True:
            message: Chunk | Outcome | None = self.buffer.decode_next(child_decoder)
            if isinstance(message, Chunk):
                await trio.lowlevel.checkpoint()
            if message is not None:
                return message
            if pieces:  # a message in several pieces (a large outcome): others are served in between
                await trio.lowlevel.checkpoint()
            data = _read_soon(fd, spin) if spin else None
            data = data if data is not None else await read_when_ready(self.sock)
            if not data:
                raise PeerGone
            self.buffer.add(data)
            pieces += 1

    def alive(self) -> bool:
        """An idle worker sends nothing: a readable socket means it has exited (end of
        file) or broke the protocol."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        return not poller.poll(0)

    def worn_out(self) -> bool:
        return self.calls >= MAX_CALLS or time.monotonic() - self.born > MAX_AGE_S


#: How long the event loop polls a worker's socket for the outcome before it sleeps, when
#: this call is the only one in a worker and the machine has another core for the worker.
#: A read's outcome usually comes back within ~100-200 µs; going to sleep and being woken
#: (epoll, the kernel's wake-up of another CPU, trio's scheduler) costs about as much
#: again on a virtual machine. bench_roundtrip: read_file p50 -10 to -20 %.
SPIN_SECONDS = 0.0003
_SPARE_CORE = len(os.sched_getaffinity(0)) > 1


def _read_soon(fd: int, seconds: float) -> bytes | None:
    """What arrives on non-blocking ``fd`` within ``seconds`` (busy polling), else None."""
    deadline = time.perf_counter() + seconds
    while (data := _read_now(fd)) is None:
        if time.perf_counter() > deadline:
            return None
    return data


#: The longest ``Workers.outcome_now`` waits for a worker on the loop's thread (poll's
#: unit). Anything due on the loop but a client's frame (a timer, a command's output)
#: waits at most this long.
OUTCOME_WAIT_MS = 1


def _read_now(fd: int) -> bytes | None:
    """What non-blocking ``fd`` holds (b"" at its end), or None."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


def _read_or_wait(fd: int, interrupt_fd: int | None, deadline: float) -> bytes | None:
    """What ``fd`` holds now or once readable before ``deadline``; None once the time is
    up, or ``interrupt_fd`` is readable while ``fd`` is not. Asked through ``poll`` first:
    the outcome is seldom there yet, and a read that finds nothing raises (a system call
    and an exception for nothing, on most calls)."""
    wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if interrupt_fd is not None:
        poller.register(interrupt_fd, select.POLLIN)
    if any(ready_fd == fd for ready_fd, _ in poller.poll(wait_ms)):
        return _read_now(fd)
    return None


class Begun(msgspec.Struct, eq=False):
    """A call whose ``request`` went to ``worker`` before its task ran (``Workers.begin``);
    ``unsent``: what of the frame the socket did not take at once."""

    request: SpawnRequest
    worker: Worker
    unsent: bytes | bytearray | memoryview


class Workers:
    def __init__(
        self,
        start_child: StartChild,
        cgroups: Cgroups,
        *,
        pids_max: int,
        memory_max: int,
        max_workers: int,
        idle_seconds: float,
        max_per_uid: int = 0,
        outcome_limit: int = MAX_FRAME,
    ) -> None:
        """``outcome_limit``: the most bytes a worker's message may have (``wire.outcome_limit``)."""
        self._start_child = start_child
        self._outcome_limit = outcome_limit
        self._cgroups = cgroups
        self._limits = (pids_max, memory_max)
        self.max_workers = max(1, max_workers)
        self.max_per_uid = per_uid_share(self.max_workers, max_per_uid)
        self._busy: dict[int, int] = {}  # uid -> workers its calls hold
        self.idle_seconds = idle_seconds
        self._idle: list[Worker] = []  # least recently used first
        self._in_flight = 0  # calls waiting for a worker's outcome
        self._peak_in_flight = 0  # the most at once since ``crowded`` was last asked
        self._live = 0  # idle, busy and starting
        self._freed = trio.Event()
        self._cgroups_to_remove: list[str] = []
        self._config = b""
        self._config_generation = 0
        #: Whether the event loop serves nothing but the call asking (its owner's answer):
        #: only then may a call spin for its outcome on the loop's thread.
        self.loop_serves_one_call: Callable[[], bool] = lambda: True
        #: Where abandoned calls' outcomes are waited for (without one their workers end).
        self.nursery: trio.Nursery | None = None

    def crowded(self) -> bool:
        """Whether more than one call waited for a worker at some moment since the last
        time this was asked: the loop then serves several clients at once, and has no
        core to spare."""
        peak, self._peak_in_flight = self._peak_in_flight, self._in_flight
        return peak > 1

    @property
    def live(self) -> int:
        return self._live

    def pids(self) -> list[int]:
        """The idle workers' pids (for tests and ``toold doctor``)."""
        return [w.pid for w in self._idle]

    async def run(
        self, request: SpawnRequest, config: bytes, on_chunk: OnChunk, *, begun: Begun | None = None
    ) -> Outcome:
        """Run one call (``request`` without argv or config) in a worker of its kind, which
        is started with ``config`` (the daemon's, encoded) if none is idle: its outcome.
        ``begun``: the call's request already went to a worker (``begin``).
        Raises ``WorkerFailed`` when the worker dies or misbehaves."""
        for attempt in range(2):
            outcome = await self._run_once(request, config, on_chunk, begun if not attempt else None)
            if outcome.error_code != STALE or attempt:
                return outcome
        raise AssertionError("unreachable")

    def begin(self, request: SpawnRequest, config: bytes) -> Begun | None:
        """Hand ``request`` to an idle worker of its kind now, without waiting for anything
        (None when none is idle): the worker starts on it while the event loop gets to the
        call's task. The caller then ``run``s it with the result, or ``abandon``s it."""
        kind = kind_of(request, self._generation(config))
        self._retire_idle()
        if not self._may_hold_another(request.uid):
            return None
        for worker in reversed(self._idle):
            if worker.kind == kind:
                self._idle.remove(worker)
                if not worker.alive():
                    self._end(worker)
                    return None
                self._hold(worker)
                data = frame(request)
                try:
                    sent = os.write(worker.sock.fileno(), memoryview(data)[:WRITE_PIECE])
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._end(worker)
                    return None
                self._in_flight += 1
                self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
                return Begun(request, worker, memoryview(data)[sent:])
        return None

    def outcome_now(self, begun: Begun, interrupt_fd: int | None) -> Outcome | None:
        """The outcome of a begun call if its worker has given it, or gives it within
        ``OUTCOME_WAIT_MS`` while this is the only call in a worker. The wait blocks the
        event loop's thread, asleep in ``poll``, and ends as soon as ``interrupt_fd``
        (the clients' door) is readable: it costs no CPU, where a wait through the loop
        costs a task, its scheduling and a wake-up (10 % of a read's protocol CPU).
        Without ``interrupt_fd`` nothing is waited for.

        None: ``run`` with ``begun`` finishes the call as ever. What was read stays in
        the worker's buffer for it, and so does anything else than the outcome: a call
        that streams output, or anything irregular (a worker gone, a malformed frame), is
        left for ``run`` to pass on in order, or to report. A ``STALE`` outcome has ended
        its worker: the call must be run anew, without ``begun``."""
        worker = begun.worker
        if begun.unsent:
            return None
        may_wait = interrupt_fd is not None and self._in_flight == 1
        fd = worker.sock.fileno()
        deadline = time.monotonic() + OUTCOME_WAIT_MS / 1000
        try:
            while True:
                message = worker.buffer.peek_next(child_decoder)
                if isinstance(message, Outcome):
                    worker.buffer.drop_next()
                    break
                if message is not None or time.monotonic() >= deadline:
                    return None
                data = _read_or_wait(fd, interrupt_fd, deadline) if may_wait else _read_now(fd)
                if not data:  # nothing yet, or the worker's end: ``run`` waits, or reports it
                    return None
                worker.buffer.add(data)
        except (OSError, ValueError, msgspec.DecodeError):
            return None
        # A STALE worker's workspace was made anew: it ends, and the call is run again.
        self._done_with(worker, clean=message.error_code != STALE)
        return message

    def abandon(self, begun: Begun) -> None:
        """A begun call that will not be run (its batch was cancelled first). Its worker is
        busy with it: once the outcome has been read and dropped it goes back to the idle
        ones, so that a client that cancels a read and asks for the next one does not wait
        for a new worker; one that has not answered within ``ABANDONED_SECONDS`` ends."""
        if self.nursery is None:
            self._done_with(begun.worker, clean=False)
            return
        self.nursery.start_soon(self._drain, begun)

    async def _drain(self, begun: Begun) -> None:
        worker, clean = begun.worker, False
        try:
            with trio.move_on_after(ABANDONED_SECONDS):
                await worker.send(begun.unsent)
                while not isinstance(message := await worker.receive(), Outcome):
                    pass  # streamed output nobody reads any more
                clean = message.error_code != STALE
        except (PeerGone, OSError, ValueError, msgspec.DecodeError):
            pass
        finally:
            self._done_with(worker, clean=clean)

    async def _run_once(self, request: SpawnRequest, config: bytes, on_chunk: OnChunk, begun: Begun | None) -> Outcome:
        """One try: a worker whose workspace was made anew answers ``STALE`` and exits, and
        the call is tried once more on a fresh one."""
        if begun is None:
            worker = await self._take(request, config)
            unsent: bytes | bytearray | memoryview = frame(request)
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        else:
            worker, unsent = begun.worker, begun.unsent
        clean = False
        try:
            await worker.send(unsent)
            while True:
                # nobody else waits for the loop's time
                alone = self._in_flight == 1 and _SPARE_CORE and self.loop_serves_one_call()
                message = await worker.receive(SPIN_SECONDS if alone else 0.0)
                if isinstance(message, Outcome):
                    clean = message.error_code != STALE
                    return message
                on_chunk(message)
        except (PeerGone, ConnectionResetError, BrokenPipeError):
            raise WorkerFailed("its worker exited mid-call (killed, or out of memory)") from None
        except (OSError, ValueError, msgspec.DecodeError) as exc:
            raise WorkerFailed(f"its worker broke the protocol ({exc})") from None
        finally:  # not clean: cancelled, timed out, died; whatever the worker is doing, it ends now
            self._done_with(worker, clean=clean)

    def _done_with(self, worker: Worker, *, clean: bool) -> None:
        """A call's outcome is in, or will never be read: its worker goes back to the idle
        ones after a clean outcome, and ends otherwise. One that said more than its outcome
        (bytes already read past it) ends too: they would be read as the next call's."""
        self._in_flight -= 1
        if clean and not len(worker.buffer):
            self._give_back(worker)
        else:
            self._end(worker)

    async def ensure(self, request: SpawnRequest, config: bytes) -> list[str]:
        """Have an idle worker of ``request``'s kind ready (starting one proves that the
        client can open its roots): its canonical roots. Raises ``WorkerUnavailable``."""
        worker = await self._take(request, config)
        self._give_back(worker, counts=False)
        return worker.roots

    async def _take(self, request: SpawnRequest, config: bytes) -> Worker:
        kind = kind_of(request, self._generation(config))
        while True:
            self._retire_idle()
            if self._may_hold_another(request.uid):
                for worker in reversed(self._idle):  # the most recently used: warmest caches
                    if worker.kind == kind:
                        self._idle.remove(worker)
                        if worker.alive():
                            return self._hold(worker)
                        self._end(worker)  # died while idle (killed, OOM): never hand it a call
                        break
                if self._live < self.max_workers:
                    break
                if self._idle:
                    self._end(self._idle.pop(0))
                    break
            self._freed = trio.Event() if self._freed.is_set() else self._freed
            await self._freed.wait()
        self._live += 1
        self._busy[request.uid] = self._busy.get(request.uid, 0) + 1  # its place, while it starts
        try:
            worker = await self._start(msgspec.structs.replace(request, config=config), kind)
        except BaseException:
            self._live -= 1
            self._release(request.uid)
            raise
        worker.busy = True
        return worker

    def _may_hold_another(self, uid: int) -> bool:
        return self._busy.get(uid, 0) < self.max_per_uid

    def _hold(self, worker: Worker) -> Worker:
        worker.busy = True
        self._busy[worker.uid] = self._busy.get(worker.uid, 0) + 1
        return worker

    def _release(self, uid: int) -> None:
        left = self._busy.get(uid, 0) - 1
        if left > 0:
            self._busy[uid] = left
        else:
            self._busy.pop(uid, None)
        self._freed.set()

    def _unhold(self, worker: Worker) -> None:
        if worker.busy:
            worker.busy = False
            self._release(worker.uid)

    def _generation(self, config: bytes) -> int:
        """A small number per configuration (a reload makes a new kind), so the kind
        need not hold the encoded configuration itself."""
        if config != self._config:
            self._config, self._config_generation = config, self._config_generation + 1
        return self._config_generation

    def _give_back(self, worker: Worker, *, counts: bool = True) -> None:
        self._unhold(worker)
        worker.calls += counts
        worker.last_used = time.monotonic()
        if worker.worn_out():
            self._end(worker)
            return
        self._idle.append(worker)
        self._freed.set()

    def _retire_idle(self) -> None:
        """End workers idle for longer than ``idle_seconds`` (called on every take and
        by ``retire_idle_forever``)."""
        now = time.monotonic()
        for worker in [w for w in self._idle if now - w.last_used > self.idle_seconds]:
            self._idle.remove(worker)
            self._end(worker)

    async def retire_idle_forever(self) -> None:
        while True:
            await trio.sleep(max(self.idle_seconds / 2, 0.05))
            self._retire_idle()

    async def _start(self, request: SpawnRequest, kind: Kind) -> Worker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pids_max, memory_max = self._limits
        try:
            group = self._cgroups.create(f"worker-{secrets.token_hex(8)}", pids_max=pids_max, memory_max=memory_max)
        except CgroupUnavailable as exc:
            ours.close()
            theirs.close()
            raise WorkerUnavailable(str(exc)) from None
        worker_request = msgspec.structs.replace(
            request,
            worker=True,
            call_id="worker",
            token="",
            tool="",
            args=b"",
            resolved={},
            reads={},
            preview=False,
            network=False,
            writable=[],
            cgroups=self._cgroups.paths(group),
        )
        sock = trio.socket.from_stdlib_socket(ours)
        try:
            pid = await self._start_child(worker_request, theirs.fileno())
        except BaseException:
            sock.close()
            self._cgroups.remove(group)
            raise
        finally:
            theirs.close()
        worker = Worker(pid=pid, sock=sock, kind=kind, cgroup=group, buffer=FrameBuffer(self._outcome_limit))
        try:
            with trio.fail_after(_READY_TIMEOUT_S):
                ready = child_decoder.decode(await receive_frame(sock))
        except (OSError, PeerGone, msgspec.DecodeError, trio.TooSlowError) as exc:
            self._end(worker, counted=False)
            raise WorkerUnavailable(f"no worker could be started: {exc or type(exc).__name__}") from None
        except BaseException:  # cancelled while it started: it must not live on, uncounted
            self._end(worker, counted=False)
            raise
        if not isinstance(ready, Outcome) or not ready.ok:
            self._end(worker, counted=False)
            reason = ready.error_message if isinstance(ready, Outcome) else "no announcement"
            raise WorkerUnavailable(f"no worker could be started: {reason}")
        worker.layers = dict(ready.layers)
        worker.roots = [str(r) for r in (ready.data or {}).get("roots", [])]
        return worker

    def _end(self, worker: Worker, *, counted: bool = True) -> None:
        """Kill a worker that is not in the idle list, and free its place."""
        self._unhold(worker)
        worker.sock.close()
        if not self._cgroups.kill(worker.cgroup):
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if worker.cgroup:
            self._cgroups_to_remove.append(worker.cgroup)
        self._cgroups_to_remove = [g for g in self._cgroups_to_remove if not self._cgroups.remove(g)]
        if counted:
            self._live -= 1
            self._freed.set()

    def close(self) -> None:
        """End every idle worker (busy ones end with their calls' cancellation) and
        remove their cgroups once they have exited."""
        while self._idle:
            self._end(self._idle.pop())
        deadline = time.monotonic() + 1.0
        while self._cgroups_to_remove and time.monotonic() < deadline:
            time.sleep(0.005)
            self._cgroups_to_remove = [g for g in self._cgroups_to_remove if not self._cgroups.remove(g)]
