"""How many connections each local user may hold open, and the descriptors kept in reserve.

libzmq accepts every connection on the socket in its own I/O thread, and aborts the
whole process when ``accept`` fails with ``EMFILE``. So one user who opens connections
(and never speaks) must never be able to spend the daemon's descriptors: every other
user would lose service and running batches would go to recovery.

Three things keep that from happening:

- At start the descriptor limit is raised to its hard limit, and a reserve of it is
  kept out of the connections' share (the journal, workers' channels, the spawner's,
  files a tool reply needs).
- libzmq tells us of each accepted connection (a monitor event carrying its fd). Its
  peer's uid is read from the kernel (``SO_PEERCRED``) at once, and a connection past
  its uid's bound or the total bound is shut down there and then: libzmq sees the end
  of the stream and closes it. A connection is counted from accept, before any
  handshake, so half-open ones count as much as silent ones.
- libzmq's own handshake timeout (``HANDSHAKE_SECONDS``) ends a connection that never
  completes its greeting.

The monitor's events are queued between libzmq's thread and ours; while that queue is
full, libzmq's thread waits, so it cannot accept far ahead of the counting.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import struct
from collections import Counter

import msgspec

log = logging.getLogger(__name__)

#: A connection that has not completed its greeting by then is closed by libzmq.
HANDSHAKE_SECONDS = 5.0
#: Descriptors never handed to connections: at least this many, or a quarter of the limit.
MIN_RESERVE = 1024
_UCRED = struct.Struct("3i")


def raise_descriptor_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:  # a hard limit above nr_open, say
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_budget(limit: int, configured: int) -> int:
    """Connections all users may hold together: the configured total, but never more than
    the descriptor limit leaves once the reserve is kept."""
    reserve = max(MIN_RESERVE, limit // 4)
    return max(16, min(configured, limit - reserve))


class Tracked(msgspec.Struct, frozen=True):
    uid: int
    inode: int


class ConnectionGuard:
    """Counts accepted connections per uid and sheds those past the bounds.

    Keyed by fd, as libzmq's events are: events arrive in the order libzmq emitted them,
    so an fd closed and reused before its first event was read is counted once, under the
    uid that holds it now, and forgotten when its own disconnect arrives.
    """

    def __init__(self, *, per_uid: int, total: int) -> None:
        self.per_uid = per_uid
        self.total = total
        self._listen_path: bytes | None = None
        self._by_fd: dict[int, Tracked] = {}
        self._per_uid: Counter[int] = Counter()
        self.shed = 0  # connections shut down for being past a bound, since start

    def set_listen_path(self, path: bytes | None) -> None:
        """The listening socket's name: a fd whose own name differs is not a connection of ours."""
        self._listen_path = path

    # ------------------------------------------------------------------ events

    def accepted(self, fd: int) -> None:
        """A connection was accepted on ``fd``: count it, or shut it down if its uid (or
        everyone together) already holds as many as allowed."""
        self.disconnected(fd)  # a stale entry for a reused fd
        peer = _peer_of_accepted(fd, self._listen_path)
        if peer is None:
            return  # gone already, or the fd is no longer one of our connections
        uid, inode = peer
        if self._per_uid[uid] >= self.per_uid or len(self._by_fd) >= self.total:
            self.shed += 1
            if self.shed == 1 or self.shed % 1000 == 0:
                which = "its uid's" if self._per_uid[uid] >= self.per_uid else "the total"
                log.warning("uid %d: connection shut down, %s bound reached (%d shed)", uid, which, self.shed)
            _shut_down(fd)
            return
        self._by_fd[fd] = Tracked(uid, inode)
        self._per_uid[uid] += 1

    def disconnected(self, fd: int) -> None:
        tracked = self._by_fd.pop(fd, None)
        if tracked is not None:
            self._per_uid[tracked.uid] -= 1
            if not self._per_uid[tracked.uid]:
                del self._per_uid[tracked.uid]

    def audit(self) -> None:
        """Forget connections whose fd is closed or now holds another file (a close libzmq
        did not announce)."""
        for fd, tracked in list(self._by_fd.items()):
            try:
                alive = os.fstat(fd).st_ino == tracked.inode
            except OSError:
                alive = False
            if not alive:
                self.disconnected(fd)

    # ------------------------------------------------------------------ queries

    def held_by(self, uid: int) -> int:
        return self._per_uid[uid]

    def held(self) -> int:
        return len(self._by_fd)


def _peer_of_accepted(fd: int, listen_path: bytes | None) -> tuple[int, int] | None:
    """(uid, inode) of the peer on ``fd`` if ``fd`` is a connection accepted on our
    listening socket; None otherwise. Reads through the fd without taking it over."""
    try:
        sock = socket.socket(fileno=fd)
    except (OSError, ValueError):  # closed, not a socket, or no fd at all
        return None
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            return None
        if listen_path is not None and os.fsencode(sock.getsockname() or b"") != listen_path:
            return None  # the fd was closed and now holds some other socket of ours
        _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        return uid, os.fstat(fd).st_ino
    except OSError:
        return None
    finally:
        sock.detach()


def _shut_down(fd: int) -> None:
    """End the stream on ``fd`` without closing the descriptor, which is libzmq's: it
    reads the end and closes the connection itself."""
    try:
        sock = socket.socket(fileno=fd)
    except (OSError, ValueError):
        return  # closed meanwhile (and perhaps no longer a socket): nothing to end
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already gone
    finally:
        sock.detach()
