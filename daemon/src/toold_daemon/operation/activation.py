"""Socket activation: serving on a Unix socket that systemd (or
``systemd-socket-activate``) bound and passed, instead of binding one.

The first passed fd (``SD_LISTEN_FDS_START`` = 3) must be a listening ``AF_UNIX``
stream socket bound to a path; the endpoint is taken from the socket's own name.
``LISTEN_PID`` must be this process (the variables are meant for it alone) and all
three variables are removed once read. A socket the daemon did not bind is never
unlinked, locked or re-moded by it: it belongs to the unit.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

import msgspec

LISTEN_FDS_START = 3


class ActivationError(Exception):
    """The passed fds are not what toold can serve on; the message says why."""


class Activated(msgspec.Struct, frozen=True):
    fd: int
    endpoint: str  # ipc://PATH, from the socket's own name
    name: str  # LISTEN_FDNAMES' first entry ("" if none)


def take_activated_socket(environ: MutableMapping[str, str] | None = None) -> Activated | None:
    """The passed socket, or None when the daemon was not socket-activated."""
    env = os.environ if environ is None else environ
    pid, count, names = env.pop("LISTEN_PID", ""), env.pop("LISTEN_FDS", ""), env.pop("LISTEN_FDNAMES", "")
    if not count:
        return None
    if pid != str(os.getpid()):
        return None  # meant for another process (a parent that did not clear them)
    if not count.isdigit() or int(count) < 1:
        raise ActivationError(f"LISTEN_FDS={count!r} passes no socket")
    fd = LISTEN_FDS_START
    probe = socket.socket(fileno=os.dup(fd))
    try:
        if probe.family != socket.AF_UNIX or probe.type != socket.SOCK_STREAM:
            raise ActivationError("the passed socket is not a Unix stream socket (ListenStream=/path)")
        if not probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ActivationError("the passed socket is not listening (Accept=no is needed)")
        path = probe.getsockname()
    finally:
        probe.close()
    if not isinstance(path, str) or not path.startswith("/"):
        raise ActivationError(f"the passed socket is not bound to a path ({path!r})")
    os.set_inheritable(fd, False)
    return Activated(fd=fd, endpoint=f"ipc://{path}", name=names.split(":")[0])
