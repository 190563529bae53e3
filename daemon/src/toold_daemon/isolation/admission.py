"""What the spawner checks on its own before it starts anything for a request.

The spawner is the only process that keeps root. It must not trust the protocol process
(which decodes every client's frames) more than that process deserves: whatever that
process asks, the spawner starts children only for uids the administrator lets use the
daemon, only on roots that uid may use, and only for requests the protocol process
itself sent (the kernel's SCM_CREDENTIALS on every message: a tool that got hold of the
socket sends with its own pid, which it cannot forge without CAP_SYS_ADMIN). A
compromised protocol process can then act as an allowed user on that user's
workspaces, and as nobody else.
"""

from __future__ import annotations

import array
import os
import re
import socket
import stat
import struct

import msgspec

from ..sandbox.workspaces import allowed_places_for, inside
from .wire import MAX_FRAME, SpawnRequest, close_fds

PROBE = "_probe"
_CALL_CGROUP = re.compile(r"(?:call|zygote|worker)-[0-9a-f]{1,32}")
_UCRED = struct.Struct("3i")
_HEADER = struct.Struct(">I")


class Refused(Exception):
    """The request is not one the spawner may serve (the message says why)."""


class Admission(msgspec.Struct, frozen=True):
    """The spawner's rules, fixed when it starts (from the administrator's config)."""

    daemon_roots: tuple[str, ...] = ()  # canonical
    allowed_roots: tuple[str, ...] = ()  # ``[tools.sandbox] allowed_roots``, "~" unexpanded
    allowed_uids: tuple[int, ...] | None = None  # None: whom the socket lets connect
    allowed_gids: tuple[int, ...] = ()
    allow_root_clients: bool = False
    socket_path: str = ""  # read for its owner, group and mode when allowed_uids is None
    any_root: bool = False  # only for a spawner that serves its own uid alone (benchmarks)
    readable_paths: tuple[str, ...] = ()  # what ``[[mcp.servers]] read_paths`` name, canonical

    def check(self, request: SpawnRequest) -> None:
        """Raise ``Refused`` unless ``request``'s uid and roots are ones this spawner serves."""
        uid = request.uid if request.uid >= 0 else os.geteuid()
        if request.tool == PROBE and not (request.roots or request.argv or request.worker or request.zygote):
            return  # the daemon's look at which layers the kernel grants: a no-op, on no roots
        if not self.uid_allowed(uid, request.gid if request.gid >= 0 else os.getegid()):
            raise Refused(f"uid {uid} may not use this daemon")
        if request.roots and not self.any_root:
            places = allowed_places_for(self.allowed_roots, self.daemon_roots, uid)
            for root in request.roots:
                real = os.path.realpath(root)  # as root: every symlink on the way resolved
                if not any(inside(real, place) for place in places):
                    raise Refused(f"uid {uid} may not use {root} as a root")
        for path in request.readable:
            if not any(inside(os.path.realpath(path), place) for place in self.readable_paths):
                raise Refused(f"{path} is not a directory the configuration lets servers read")

    def uid_allowed(self, uid: int, gid: int) -> bool:
        if uid == 0:
            return self.allow_root_clients
        if uid == os.geteuid():
            return True  # a user instance serves its own user
        if self.allowed_uids is not None:
            return uid in self.allowed_uids or (gid in self.allowed_gids and gid != 0)
        return self._socket_admits(uid, gid)

    def _socket_admits(self, uid: int, gid: int) -> bool:
        """Whether the socket's owner, group and mode let ``uid`` connect (its primary
        group, or a supplementary one from the group database)."""
        if not self.socket_path:
            return False
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return False
        rw = stat.S_IRUSR | stat.S_IWUSR
        if st.st_uid == uid and st.st_mode & rw == rw:
            return True
        if st.st_mode & (stat.S_IROTH | stat.S_IWOTH) == stat.S_IROTH | stat.S_IWOTH:
            return True
        if st.st_mode & (stat.S_IRGRP | stat.S_IWGRP) == stat.S_IRGRP | stat.S_IWGRP:
            return gid == st.st_gid or st.st_gid in _groups_of(uid, gid)
        return False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel saw it connect."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


def check_cgroups(paths: list[str], bases: frozenset[str]) -> None:
    """Raise ``Refused`` unless every path is one of the daemon's own call cgroups: a
    ``call-``/``zygote-``/``worker-`` directory right below one of ``bases`` (what
    ``cgroup.call_bases_of`` found for the daemon), or the one of the same name inside it
    (the innermost, in the unified hierarchy). A child joins them as root, so a
    compromised daemon could otherwise put a process into any cgroup of the machine."""
    for path in paths:
        name = os.path.basename(path)
        parent = os.path.dirname(path)
        if os.path.basename(parent) == name:
            parent = os.path.dirname(parent)
        if os.path.normpath(path) != path or parent not in bases or not _CALL_CGROUP.fullmatch(name):
            raise Refused(f"{path!r} is not one of the daemon's call cgroups")


def _groups_of(uid: int, gid: int) -> list[int]:
    import pwd

    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except (KeyError, OSError):
        return [gid]


def enable_credentials(sock: socket.socket) -> None:
    """Have the kernel attach the sender's pid, uid and gid to every message we read."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def receive_checked(sock: socket.socket, sender_pid: int) -> tuple[bytes, list[int]] | None:
    """One frame (with any SCM_RIGHTS fds) from a blocking socket with SO_PASSCRED, every
    piece of it sent by ``sender_pid``; None at end of file. A frame from any other
    process raises ``Refused`` (its fds closed, the rest of it read and dropped)."""
    fds: list[int] = []
    senders: set[int] = set()
    header = _read(sock, _HEADER.size, fds, senders)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        close_fds(fds)
        raise ValueError(f"frame of {size} bytes is over the limit")
    body = _read(sock, size, fds, senders) if size else b""
    if body is None:
        close_fds(fds)
        return None
    if senders != {sender_pid}:
        close_fds(fds)
        strangers = sorted(senders - {sender_pid})
        raise Refused(f"a request from pid {strangers[0] if strangers else '?'}, not the daemon's")
    return body, fds


def _read(sock: socket.socket, size: int, fds: list[int], senders: set[int]) -> bytes | None:
    parts = bytearray()
    room = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(4 * 4)
    while len(parts) < size:
        data, ancillary, _flags, _addr = sock.recvmsg(size - len(parts), room)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                senders.add(_UCRED.unpack(payload[: _UCRED.size])[0])
            elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % 4])
                fds.extend(received)
        if not data:
            return None
        parts += data
    return bytes(parts)
