"""The only module that imports zmq: the daemon's ROUTER socket and its ZAP handler.

Trio integration. ``ZMQ_FD`` is edge-triggered and any socket operation may consume
the edge, so one *pump* task owns the ROUTER and does every recv and send: it
drains outgoing messages, then receives until ``recv`` says ``Again``, and only then
waits on the fd. Other tasks queue outgoing frames with :meth:`IpcServer.send` (never
blocks) and wake the pump by cancelling its wait.

Peer identity. libzmq runs ZAP only when ``ZAP_DOMAIN`` is set, and accepts every
peer if no handler is bound at ``inproc://zeromq.zap.01``, so the handler is bound
before the ROUTER. For ipc peers libzmq passes ``Address`` = ``localhost:UID:GID:PID``
(from SO_PEERCRED); the handler answers with that as the ZAP user id, and every
frame from the peer then carries it as ``User-Id``. A peer without such an address
(tcp) is refused.

Vanished peers. libzmq tells a ROUTER nothing when a peer disconnects, so each peer's
connection is remembered as the (fd, inode) its first frame came from (``ZMQ_SRCFD``),
and a watcher checks those every :data:`PEER_CHECK_SECONDS`: a closed fd, or one now
holding another socket, means the peer is gone. A connection's fd cannot be reused while
it is open, so a live peer is never taken for gone; a peer whose fd was reused before
its first frame was read is only noticed late (when the newer connection closes).

One daemon per socket. ``bind`` on an ipc path silently unlinks an existing socket,
so an exclusive ``flock`` on ``<socket>.lock`` is taken first.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import socket
import struct
import termios
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import trio
import zmq

from toold_protocol import Identity

from .backlog import Backlogs
from .connections import HANDSHAKE_SECONDS, ConnectionGuard
from .intake import Intake
from .socket_dir import SocketAccess, take_lock

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"toold"
_PEER_ADDRESS = re.compile(r"^(?:localhost:)?(\d+):(\d+):(\d+)$")
_RETRY_BLOCKED_SECONDS = 0.005
PEER_CHECK_SECONDS = 0.2
_LIBZMQ_FRAMES_PER_PEER = 64
#: Bytes handed to libzmq for one connection before it must be seen reading for more to go.
IN_FLIGHT_BYTES = 4 << 20
#: A connection whose kernel send queue holds less than this is reading.
_READING_BELOW_BYTES = 64 << 10
_INT = struct.Struct("i")
_MONITOR_ENDPOINT = "inproc://toold.connections"
_MONITOR_EVENT = struct.Struct("=HI")  # libzmq's first monitor frame: event, value (the fd)
_AUDIT_SECONDS = 1.0
#: Frames, and their bytes, read ahead of serving them. Reading everything libzmq holds
#: is what lets a user's one frame be served before another user's many connections'
#: queued ones; past these bounds the rest wait inside libzmq (bounded per connection).
_INTAKE_FRAMES = 16_384
_INTAKE_BYTES = 64 << 20
# pyzmq's constants as plain ints: as enum members, each ``&`` builds a new member (µs
# per frame on the pump's path).
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
#: Serving frames in rotation stops after this long, to let the batch tasks run and read
#: the frames that arrived meanwhile (another uid's among them).
_SERVE_SECONDS = 0.0005


class Inbound(msgspec.Struct, frozen=True):
    peer: bytes
    identity: Identity
    frame: bytes | None  # None: the peer is gone, or stopped reading (see ``overflowed``)
    parts: int = 1
    overflowed: str = ""  # why its backlog passed a bound: dropped, further frames discarded


FrameHandler = Callable[[Inbound], None]
#: Given a peer's kernel credentials, why it may not connect (None: it may).
Admission = Callable[[Identity], str | None]


def parse_peer_address(address: str) -> Identity | None:
    match = _PEER_ADDRESS.match(address)
    if match is None:
        return None
    uid, gid, pid = (int(x) for x in match.groups())
    return Identity(uid=uid, gid=gid, pid=pid)


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint.removeprefix("ipc://")) if endpoint.startswith("ipc://") else None


class IpcServer:
    def __init__(
        self,
        endpoint: str,
        *,
        hard_max_frame_bytes: int,
        max_backlog_bytes: int = 16 << 20,
        max_uid_backlog_bytes: int = 128 << 20,
        refuse: Admission | None = None,
        activated_fd: int | None = None,
        heir: int | None = None,
        guard: ConnectionGuard | None = None,
        socket_access: SocketAccess | None = None,
    ) -> None:
        self.endpoint = endpoint
        #: Who may connect: the socket's group and mode (default: the daemon's group, 0600).
        self.access = socket_access or SocketAccess()
        #: Counts each uid's connections from accept on and sheds those past the bounds.
        self.guard = guard
        self._monitor: zmq.Socket[bytes] | None = None
        #: The uid a root start drops to: the socket's directory and lock may be its already.
        self.heir = heir
        #: A listening socket passed by systemd: served as it is, never locked, re-moded or unlinked.
        self.activated_fd = activated_fd
        self._refuse = refuse
        self._handler: FrameHandler | None = None
        self._hard_max = hard_max_frame_bytes
        self._backlogs = Backlogs(max_backlog_bytes, max_uid_backlog_bytes, self._seen_reading)
        self._ctx = zmq.Context()
        self._router: zmq.Socket[bytes] | None = None
        self._router_fd: int | None = None
        self._zap: zmq.Socket[bytes] | None = None
        self._lock_fd: int | None = None
        self._outbox: dict[bytes, collections.deque[bytes]] = {}
        self._overflowed: set[bytes] = set()  # frames to these are discarded until they send again
        self._telling: bytes | None = None  # the peer whose handler is being told it overflowed
        self._blocked: set[bytes] = set()
        self._wake: trio.CancelScope | None = None
        self._identities: dict[bytes, Identity] = {}
        self._user_ids: dict[bytes, str] = {}  # the ZAP user id each peer's frames carry
        self._connections: dict[bytes, tuple[int, int]] = {}  # peer -> (fd, inode) of its socket
        self._intake: Intake[Inbound] = Intake(lambda inbound: inbound.peer)
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    def claim(self) -> None:
        """Make the socket's directory and take its lock (with the privileges the process
        starts with). Raises EndpointInUse."""
        path = ipc_path(self.endpoint) if self.activated_fd is None else None
        if path is not None:
            self._lock_fd = take_lock(path, self.endpoint, heir=self.heir, gid=self.access.gid)

    def bind(self) -> None:
        """Bind the ZAP handler, then the ROUTER (``claim`` first). libzmq starts its
        threads here, with the privileges the process has now."""
        path = ipc_path(self.endpoint) if self.activated_fd is None else None
        zap = self._ctx.socket(zmq.REP)
        zap.linger = 0
        zap.bind(ZAP_ENDPOINT)
        self._zap = zap
        router = self._ctx.socket(zmq.ROUTER)
        router.zap_domain = ZAP_DOMAIN
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.MAXMSGSIZE, self._hard_max)
        # Few frames wait inside libzmq per peer (its bound counts frames, not bytes); the
        # rest wait in our outbox, whose bound counts bytes (max_backlog_bytes).
        router.setsockopt(zmq.SNDHWM, _LIBZMQ_FRAMES_PER_PEER)
        router.setsockopt(zmq.RCVHWM, 10_000)
        # A client whose process is stopped (or whose end of a forwarded socket is gone)
        # stops answering heartbeats; its connection is closed after the timeout, as one
        # that died would be at once, so its queued frames are freed sooner.
        router.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        router.linger = 1000
        # A connection that never finishes its greeting holds a descriptor only this long.
        router.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * 1000))
        if self.guard is not None:
            self._monitor = self._watch_connections(router)
        if self.activated_fd is not None:
            router.setsockopt(zmq.USE_FD, self.activated_fd)  # libzmq adopts it instead of binding
        if path is None:
            router.bind(self.endpoint)
        else:
            old_umask = os.umask(0o177)  # born 0600: never wider than asked, even for a moment
            try:
                router.bind(self.endpoint)
            finally:
                os.umask(old_umask)
            if self.access.gid is not None:
                os.chown(path, -1, self.access.gid)
            os.chmod(path, self.access.mode)
        self._router = router

    def _watch_connections(self, router: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
        """libzmq's accept and disconnect events, read by ``_monitor_loop``. Connected
        before the ROUTER binds: libzmq waits on a monitor with no reader."""
        router.monitor(_MONITOR_ENDPOINT, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        monitor = self._ctx.socket(zmq.PAIR)
        monitor.linger = 0
        monitor.connect(_MONITOR_ENDPOINT)
        return monitor

    def _listen_path(self) -> bytes | None:
        """The name accepted connections carry as their own address (getsockname)."""
        if self.activated_fd is None:
            path = ipc_path(self.endpoint)
            return os.fsencode(path) if path is not None else None
        listener = socket.socket(fileno=self.activated_fd)
        try:
            name = listener.getsockname()
        finally:
            listener.detach()
        return os.fsencode(name) if name else None

    def forget(self, peer: bytes) -> None:
        """Drop what is queued for a peer the handler no longer serves. What libzmq still
        holds for it stays counted, and its connection watched, until it is gone. Frames it
        sent that still wait their turn are served when it comes (a new session, as for
        any frame it sends later)."""
        self._drop_queue(peer)
        identity = self._identities.get(peer)
        if identity is not None and self._intake.holds(identity.uid, peer):
            return
        self._identities.pop(peer, None)
        self._user_ids.pop(peer, None)
        if not self._backlogs.in_flight(peer):
            self._connections.pop(peer, None)
            self._backlogs.gone(peer)

    def close(self) -> None:
        """Close sockets (flushing for up to the linger time), remove the socket file, drop the lock."""
        if self.closed:
            return
        self.closed = True
        self._router_fd = None
        self._flush_outbox()
        if self._router is not None and self._monitor is not None:
            self._router.disable_monitor()
        for sock in (self._router, self._zap, self._monitor):
            if sock is not None:
                sock.close()
        self._ctx.term()
        path = ipc_path(self.endpoint)
        if path is not None and self._lock_fd is not None:
            for leftover in (path, path.with_name(path.name + ".lock")):
                try:
                    leftover.unlink()
                except FileNotFoundError:
                    pass
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ the door

    def ringing(self) -> bool:
        """Frames are waiting: read and not served yet, or in libzmq (``Doorbell``).

        Asking libzmq takes the edge of the descriptor the pump sleeps on: when another
        task asks (a batch's, before it holds the loop a moment) and frames wait, the pump
        is woken, or they would wait for whatever next woke it (another client's frame,
        a batch's end: a slow read held a ping 300 ms so)."""
        if self._intake or self._router is None:
            return True
        if not _frames_wait(self._router):
            return False
        if self._wake is not None:
            self._wake.cancel()
        return True

    def fileno(self) -> int:
        """libzmq's descriptor for the clients' socket: readable once something comes for
        it (a frame; or something of its own, which only ends a wait early)."""
        assert self._router is not None
        if self._router_fd is None:  # (asked for every read that waits for its worker)
            self._router_fd = int(self._router.getsockopt(zmq.FD))
        return self._router_fd

    # ------------------------------------------------------------------ sending

    def send(self, peer: bytes, frame: bytes, flush: bool = False) -> None:
        """Queue a frame for ``peer``. Never blocks; the pump sends it, or this call with
        ``flush`` (a batch's last frame: its client waits for nothing else).

        A peer that stops reading while frames keep coming would grow its queue without
        end, so past ``max_backlog_bytes`` (or its uid's clients past
        ``max_uid_backlog_bytes``) the queue is dropped and the handler told (as for a
        vanished peer, with ``overflowed``). What the handler sends while told still goes
        out (its notice to the peer); later frames are discarded until the peer sends
        again. Sending does not show it reads again: one that submits and never reads is
        cut off again as soon as its results pass the bound, and what libzmq holds for it
        stays counted until it reads or is gone.
        """
        if self.closed or peer in self._overflowed:
            return
        if peer not in self._identities and peer != self._telling:
            return  # gone, or not yet seen: its id may come back as another client's
        if peer != self._telling:
            refused = self._backlogs.refusal(peer, len(frame))
            if refused is not None:
                self._overflow(peer, refused)
                return
        self._outbox.setdefault(peer, collections.deque()).append(frame)
        self._backlogs.add_queued(peer, len(frame))
        if flush and peer not in self._blocked:
            self._flush_peer(peer, in_pump=False)
        if self._wake is not None and (peer in self._outbox or self._input_waiting()):
            self._wake.cancel()

    def _input_waiting(self) -> bool:
        """Whether frames wait unannounced. A send may consume the edge of libzmq's
        descriptor that announced them, so the sleeping pump must be woken to read them;
        when none wait, any that arrive later raise the edge again."""
        router = self._router
        return router is not None and _frames_wait(router)

    def _overflow(self, peer: bytes, why: str) -> None:
        log.warning("peer %r stopped reading (%s): dropped %d queued bytes", peer, why, self._backlogs.queued(peer))
        self._drop_queue(peer)
        identity = self._drop_intake(peer)
        self._user_ids.pop(peer, None)
        if identity is not None:
            self._telling = peer
            try:
                self._dispatch(Inbound(peer, identity, None, overflowed=why))
            finally:
                self._telling = None
        self._overflowed.add(peer)

    def _drop_intake(self, peer: bytes) -> Identity | None:
        """Stop taking ``peer`` for the connection it was (it is gone, was cut off, or its
        id now names another connection): its identity goes, and the frames it sent that
        still wait their turn are dropped. Returns the identity it had."""
        identity = self._identities.pop(peer, None)
        if identity is not None:
            self._intake.drop(identity.uid, peer)
        return identity

    def _drop_queue(self, peer: bytes) -> None:
        self._outbox.pop(peer, None)
        self._backlogs.drop_queued(peer)
        self._blocked.discard(peer)

    def _seen_reading(self, peer: bytes) -> bool:
        """Whether ``peer``'s kernel send queue is nearly empty: what libzmq wrote there
        was read, so what it still holds is on its way. A peer without a socket of its
        own (inproc) always is; one whose descriptor now holds another socket never is."""
        connection = self._connections.get(peer)
        if connection is None:
            return True
        fd, inode = connection
        try:
            if os.fstat(fd).st_ino != inode:
                return False
            unread = _INT.unpack(fcntl.ioctl(fd, termios.TIOCOUTQ, bytes(_INT.size)))[0]
        except OSError:
            return False
        return bool(unread < _READING_BELOW_BYTES)

    def pending(self) -> int:
        return sum(len(q) for q in self._outbox.values())

    def waiting_bytes_by_uid(self) -> dict[int, int]:
        """Bytes waiting for each uid's clients: queued here, or handed to libzmq and not
        yet seen read."""
        return self._backlogs.held_by_uid()

    def _flush_outbox(self) -> None:
        for peer in list(self._outbox):
            self._flush_peer(peer)

    def _flush_peer(self, peer: bytes, *, in_pump: bool = True) -> None:
        """Send what waits for ``peer`` until its pipe is full. A vanished peer is reported
        to the handler only from the pump (``in_pump``), never from inside a handler."""
        router = self._router
        queue = self._outbox.get(peer)  # a handler told of a gone peer may have dropped others
        if router is None or queue is None:
            return
        backlogs = self._backlogs
        if queue and backlogs.in_flight(peer) >= IN_FLIGHT_BYTES and self._seen_reading(peer):
            backlogs.reading(peer)  # once per flush: libzmq may not have written what this one hands
        while queue:
            if backlogs.in_flight(peer) >= IN_FLIGHT_BYTES:
                self._blocked.add(peer)  # until it is seen reading what it was handed
                return
            try:
                # Two sends rather than ``send_multipart``: the same frames (libzmq takes
                # the rest of a message whose first part it took), at half the cost.
                router.send(peer, _NOBLOCK_MORE, copy=False)
                router.send(queue[0], _NOBLOCK, copy=False)
            except zmq.Again:
                self._blocked.add(peer)  # its pipe is full: try again shortly
                return
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    if in_pump:
                        self._peer_gone(peer)
                    return
                raise
            backlogs.handed_over(peer, len(queue.popleft()))
            self._blocked.discard(peer)
        if self._outbox.get(peer) is queue:
            self._drop_queue(peer)

    def _peer_gone(self, peer: bytes) -> None:
        """Drop what is queued for a vanished peer and tell the handler, once."""
        self._drop_queue(peer)
        self._connections.pop(peer, None)
        self._backlogs.gone(peer)
        self._overflowed.discard(peer)  # (a cut-off peer's connection stays watched until it goes)
        identity = self._drop_intake(peer)
        self._user_ids.pop(peer, None)
        if identity is not None:
            self._dispatch(Inbound(peer, identity, None))

    # ------------------------------------------------------------------ pumps

    async def serve(
        self, handler: FrameHandler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Pump frames to ``handler`` until cancelled. Call :meth:`bind` first."""
        self._handler = handler
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._zap_loop)
            nursery.start_soon(self._watch_peers)
            if self._monitor is not None:
                nursery.start_soon(self._monitor_loop, self._monitor)
            task_status.started()
            await self._pump()

    async def _pump(self) -> None:
        router = self._router
        assert router is not None
        fd = self.fileno()
        while True:
            # One scheduler step first, so that a flood of frames never starves the batch
            # tasks; what they queued meanwhile leaves in this flush. After a wait too: the
            # tasks woken with the pump go first (what skipping it trades: architecture.md).
            await trio.lowlevel.checkpoint()
            self._read_inbound(router)
            self._serve_intake()
            self._flush_outbox()  # replies to what was just served, at once
            if self.ringing():
                continue  # frames wait their turn, or unannounced: a send may consume the edge
            with trio.CancelScope() as wake:
                self._wake = wake
                if self._blocked:
                    wake.deadline = trio.current_time() + _RETRY_BLOCKED_SECONDS
                await trio.lowlevel.wait_readable(fd)
            self._wake = None

    def _serve_intake(self) -> None:
        """Hand the frames read to the handler, one uid's at a time in rotation, for up to
        ``_SERVE_SECONDS``; the pump then reads again, and what came meanwhile joins."""
        intake = self._intake
        deadline = time.perf_counter() + _SERVE_SECONDS
        while intake:
            self._dispatch(intake.take())
            if time.perf_counter() > deadline:
                return

    def _read_inbound(self, router: zmq.Socket[bytes]) -> None:
        """Read what libzmq holds into the intake, up to its bounds."""
        intake = self._intake
        # The pump comes here woken by libzmq's descriptor or told that frames wait, so a
        # frame is there nearly always: the first is read at once. After it, asking
        # whether another waits costs less than reading until zmq.Again is raised.
        first = True
        while intake.waiting < _INTAKE_FRAMES and intake.bytes < _INTAKE_BYTES and (first or _frames_wait(router)):
            first = False
            try:
                frames = _receive_parts(router)
            except zmq.Again:
                return
            peer = frames[0].bytes
            self._overflowed.discard(peer)
            user_id = frames[1].get("User-Id") if len(frames) > 1 else None
            identity = self._identities.get(peer)
            if identity is not None and user_id != self._user_ids.get(peer):
                # A client picks its own routing id: under a closed client's id, another
                # connection (another user's) is a new peer, never the old one.
                self._peer_gone(peer)
                identity = None
            if identity is None:
                identity = parse_peer_address(user_id if isinstance(user_id, str) else "")
                if identity is None:
                    continue  # cannot happen after ZAP accepted the peer; refuse silently
                self._identities[peer] = identity
                self._user_ids[peer] = str(user_id)
                self._remember_connection(peer, frames[0])
                self._backlogs.connected(peer, identity.uid)
            frame = frames[1].bytes if len(frames) > 1 else b""
            intake.add(identity.uid, Inbound(peer, identity, frame, parts=len(frames) - 1), len(frame))

    def _remember_connection(self, peer: bytes, frame: zmq.Frame) -> None:
        fd = frame.get(zmq.SRCFD)
        if not isinstance(fd, int) or fd < 0:
            return  # not from a socket fd (inproc): nothing to watch
        try:
            self._connections[peer] = (fd, os.fstat(fd).st_ino)
        except OSError:
            self._connections[peer] = (fd, -1)  # closed before we read its frame: gone

    def vanished_peers(self) -> list[bytes]:
        """Peers whose socket is closed, or whose fd now holds another socket."""
        gone = []
        for peer, (fd, inode) in self._connections.items():
            try:
                alive = os.fstat(fd).st_ino == inode
            except OSError:
                alive = False
            if not alive:
                gone.append(peer)
        return gone

    async def _watch_peers(self) -> None:
        while True:
            await trio.sleep(PEER_CHECK_SECONDS)
            for peer in self.vanished_peers():
                self._peer_gone(peer)

    async def _monitor_loop(self, monitor: zmq.Socket[bytes]) -> None:
        guard = self.guard
        assert guard is not None
        guard.set_listen_path(self._listen_path())
        fd = int(monitor.getsockopt(zmq.FD))
        next_audit = trio.current_time() + _AUDIT_SECONDS
        while True:
            while _frames_wait(monitor):
                frames = monitor.recv_multipart(flags=zmq.NOBLOCK)
                if len(frames[0]) < _MONITOR_EVENT.size:
                    continue
                event, conn_fd = _MONITOR_EVENT.unpack_from(frames[0])
                try:
                    if event == zmq.EVENT_ACCEPTED:
                        guard.accepted(conn_fd)
                    elif event == zmq.EVENT_DISCONNECTED:
                        guard.disconnected(conn_fd)
                except Exception:  # counting must never end the daemon (this task's failure would)
                    log.exception("connection accounting failed for fd %d", conn_fd)
            if trio.current_time() >= next_audit:
                guard.audit()
                next_audit = trio.current_time() + _AUDIT_SECONDS
            with trio.move_on_at(next_audit):
                await trio.lowlevel.wait_readable(fd)

    def _dispatch(self, inbound: Inbound) -> None:
        assert self._handler is not None
        try:
            self._handler(inbound)
        except Exception:  # a handler bug must not stop the pump for everyone else
            log.exception("handler failed on a frame from peer %r", inbound.peer)

    async def _zap_loop(self) -> None:
        zap = self._zap
        assert zap is not None
        fd = int(zap.getsockopt(zmq.FD))
        while True:
            while _frames_wait(zap):
                request = zap.recv_multipart()
                zap.send_multipart(_zap_reply(request, self._refuse))
            await trio.lowlevel.wait_readable(fd)


def _zap_reply(request: list[bytes], refuse: Admission | None = None) -> list[bytes]:
    """Accept ipc peers with kernel credentials that ``refuse`` does not turn away."""
    version, request_id = request[0], request[1]
    address = request[3].decode("ascii", "replace") if len(request) > 3 else ""
    identity = parse_peer_address(address)
    if version != b"1.0" or identity is None:
        return [version, request_id, b"400", b"peer credentials unavailable (only ipc:// peers)", b"", b""]
    reason = refuse(identity) if refuse is not None else None
    if reason is not None:
        log.warning("refused a connection from uid %d: %s", identity.uid, reason)
        return [version, request_id, b"400", reason.encode()[:200], b"", b""]
    user_id = f"{identity.uid}:{identity.gid}:{identity.pid}".encode()
    return [version, request_id, b"200", b"OK", user_id, b""]


def _receive_parts(sock: zmq.Socket[bytes]) -> list[zmq.Frame]:
    """The parts of the next message (``recv_multipart`` without its per-part option
    lookups); once its first part is read, the others are there."""
    parts = [sock.recv(_NOBLOCK, copy=False)]
    while parts[-1].more:
        parts.append(sock.recv(_NOBLOCK, copy=False))
    return parts


def _frames_wait(sock: zmq.Socket[bytes]) -> bool:
    """Whether ``sock`` holds a message to read now (never blocks)."""
    return bool(int(sock.getsockopt(zmq.EVENTS)) & _POLLIN)
