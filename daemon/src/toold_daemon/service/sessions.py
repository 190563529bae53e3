"""Sessions: one per client socket, created on its first message.

The table is kept in least-recently-seen order. When it is full (overall, or for one
uid) the idle session seen longest ago makes room; a session with running batches is
never evicted, so a full table of busy sessions refuses the newcomer instead.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import msgspec

from toold_protocol import PROTOCOL_VERSION, Identity

from ..sandbox import Sandbox

#: Files made for a client that did not say its umask: owner-only.
PRIVATE_UMASK = 0o077

#: The peer of a session the daemon runs for itself (finishing an undo at start): nothing
#: is sent to it.
NO_PEER = b""


class Session(msgspec.Struct):
    session_id: str
    peer: bytes
    identity: Identity
    client_name: str = ""
    protocol_version: int = PROTOCOL_VERSION
    running: int = 0
    #: Of ``running``: batches that have ended and been answered, holding their slot only
    #: until the journal (behind) has their record. Submissions wait meanwhile (``deferred``).
    journal_waits: int = 0
    #: Batches of this session being planned aside (on a thread); submissions wait meanwhile.
    planning: int = 0
    deferred: list[Callable[[], None]] = msgspec.field(default_factory=list)
    grants: set[str] = msgspec.field(default_factory=set)  # "allow for this session" answers
    sandbox: Sandbox | None = None  # its workspace's; None: the daemon's roots
    workspace: str = ""  # as accepted (canonical), "" for the daemon's roots
    workspace_problem: str = ""  # why this session may run nothing ("" when it may)
    umask: int = PRIVATE_UMASK  # the client's (from its hello), for what its calls make


class SessionsFull(Exception):
    """No room for a new session (the message says which limit)."""


class Sessions:
    def __init__(self, max_sessions: int, max_per_uid: int, on_evict: Callable[[Session], None]) -> None:
        self._by_peer: dict[bytes, Session] = {}  # least recently seen first
        #: The same sessions by uid: a submission counts its uid's running batches among
        #: that uid's sessions, not among every session of the daemon (up to a thousand).
        self._by_uid: dict[int, dict[bytes, Session]] = {}
        self._max_sessions = max_sessions
        self._max_per_uid = max_per_uid
        self._on_evict = on_evict

    def __len__(self) -> int:
        return len(self._by_peer)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_peer.values()))

    def of_uid(self, uid: int) -> Iterator[Session]:
        """The sessions of ``uid`` (a view: not to be changed while iterating)."""
        return iter(self._by_uid.get(uid, {}).values())

    def seen(self, peer: bytes, identity: Identity) -> Session:
        """The peer's session, now the most recently seen; a new one on its first message.
        Raises ``SessionsFull``."""
        session = self._by_peer.pop(peer, None)
        if session is None:
            uid = identity.uid
            mine = len(self._by_uid.get(uid, ()))
            if mine >= self._max_per_uid and not self._evict_idle(uid):
                raise SessionsFull(f"uid {uid} has {mine} sessions with running batches (max_sessions_per_uid)")
            if len(self._by_peer) >= self._max_sessions and not self._evict_idle():
                raise SessionsFull("too many sessions with running batches")
            session = Session(session_id=secrets.token_hex(8), peer=peer, identity=identity)
            self._by_uid.setdefault(uid, {})[peer] = session
        self._by_peer[peer] = session
        return session

    def holds(self, session: Session) -> bool:
        """Whether ``session`` is still its peer's (not ended, nor evicted)."""
        return self._by_peer.get(session.peer) is session

    def end(self, peer: bytes) -> Session | None:
        """Forget the peer's session (it went away); the session, if it had one."""
        session = self._by_peer.pop(peer, None)
        if session is not None:
            self._forget_uid_entry(session)
        return session

    def _evict_idle(self, uid: int | None = None) -> bool:
        """Drop the idle session seen longest ago (of ``uid`` only, when given)."""
        for peer, session in self._by_peer.items():
            if session.running == 0 and not session.planning and (uid is None or session.identity.uid == uid):
                del self._by_peer[peer]
                self._forget_uid_entry(session)
                self._on_evict(session)
                return True
        return False

    def _forget_uid_entry(self, session: Session) -> None:
        mine = self._by_uid.get(session.identity.uid)
        if mine is not None:
            mine.pop(session.peer, None)
            if not mine:
                del self._by_uid[session.identity.uid]
