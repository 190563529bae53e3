"""Which cgroup made the other end of a loopback connection.

All commands of a zygote share its network namespace's loopback, so any of them can
connect to another command's proxy listener and leave a request there, to be served as
that call's connection (under its rules and a person's answers for it). A TCP socket
carries the cgroup (v2) of the process that made it, and the kernel's socket
diagnostics (``NETLINK_SOCK_DIAG``; the cgroup since Linux 5.7) report it for a
connection named by its addresses. A diagnostics socket answers for the network
namespace it was made in: the zygote opens one inside its namespace and hands it to its
egress process, which then serves a connection only when its other end was made in the
call's own cgroup.
"""

from __future__ import annotations

import errno
import itertools
import socket
import struct

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_INET_DIAG_CGROUP_ID = 21
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2 before its socket id
_DIAG_MSG_BYTES = 72  # inet_diag_msg, after which its attributes start
_ATTRIBUTE = struct.Struct("=HH")
_REPLY_BYTES = 8192

Address = tuple[str, int]


class LoopbackPeers:
    """Looks up the cgroup of a TCP socket on this namespace's IPv4 loopback."""

    def __init__(self, diagnostics: socket.socket) -> None:
        self._socket = diagnostics
        self._sequence = itertools.count(1)

    def cgroup_of(self, own: Address, other: Address) -> int | None:
        """The cgroup id of the socket whose own address is ``own`` and whose other end
        is ``other``; None when there is no such socket, or the kernel does not say (a
        socket already closed on both sides keeps only its addresses)."""
        sequence = next(self._sequence) & 0xFFFFFFFF
        try:
            request = _REQUEST.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + _socket_id(own, other)
        except (OSError, struct.error):  # not an IPv4 address: not a loopback peer here
            return None
        header = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, sequence, 0)
        self._socket.send(header + request)
        while True:  # the kernel answers within the send; older answers are dropped
            try:
                reply = self._socket.recv(_REPLY_BYTES, socket.MSG_DONTWAIT)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return None
                raise
            if len(reply) >= _HEADER.size and _HEADER.unpack_from(reply)[3] == sequence:
                return _cgroup_in(reply)

    def close(self) -> None:
        self._socket.close()


def open_diagnostics() -> tuple[socket.socket | None, str]:
    """A diagnostics socket for this network namespace, once a connection made here shows
    that the kernel reports a socket's cgroup: (the socket, "") or (None, why not)."""
    try:
        diagnostics = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    except OSError as exc:
        return None, f"no socket diagnostics ({exc.strerror or exc})"
    try:
        with socket.socket() as listener, socket.socket() as client:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            client.connect(listener.getsockname())
            found = LoopbackPeers(diagnostics).cgroup_of(client.getsockname(), listener.getsockname())
    except OSError as exc:
        diagnostics.close()
        return None, f"socket diagnostics failed ({exc.strerror or exc})"
    if found is None:
        diagnostics.close()
        return None, "the kernel does not report a socket's cgroup (Linux 5.7)"
    return diagnostics, ""


def _socket_id(own: Address, other: Address) -> bytes:
    """inet_diag_sockid: ports and addresses in network order, any interface, no cookie."""
    return (
        struct.pack("!HH", own[1], other[1])
        + socket.inet_aton(own[0]).ljust(16, b"\0")
        + socket.inet_aton(other[0]).ljust(16, b"\0")
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )


def _cgroup_in(reply: bytes) -> int | None:
    length, kind = _HEADER.unpack_from(reply)[:2]
    if kind != _SOCK_DIAG_BY_FAMILY:  # an error: no such socket
        return None
    offset, end = _HEADER.size + _DIAG_MSG_BYTES, min(length, len(reply))
    while offset + _ATTRIBUTE.size <= end:
        size, attribute = _ATTRIBUTE.unpack_from(reply, offset)
        if size < _ATTRIBUTE.size:
            return None
        if attribute == _INET_DIAG_CGROUP_ID and size >= _ATTRIBUTE.size + 8:
            return int(struct.unpack_from("=Q", reply, offset + _ATTRIBUTE.size)[0])
        offset += (size + 3) & ~3
    return None
