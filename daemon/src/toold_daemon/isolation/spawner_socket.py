"""The spawner as a process of its own, reached over a Unix socket.

The system package runs the spawner in one unit (``toold spawner``, root) and the
protocol process in another (``toold serve``, the ``toold`` user from its first
instruction, without a single capability), so the process that parses client input can
be confined by systemd as tightly as it can be. They meet on the spawner's socket:

- The spawner's side: a 0600 socket owned by the protocol process's user in a 0750
  directory of its group; each connection's peer must be that user (SO_PEERCRED), and
  every message on it must come from the pid that connected (SCM_CREDENTIALS, checked
  per frame as for the forked spawner). One daemon is served at a time; when it goes
  away (a restart), the next one is accepted.
- The protocol process's side: connect (waiting a little while the spawner starts),
  and check that the peer is root or ourselves, so a socket planted by someone else
  is never trusted with the requests.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time

from .admission import enable_credentials, peer_credentials

log = logging.getLogger("toold.spawner")


class SpawnerUnreachable(Exception):
    """The protocol process could not reach a spawner it may trust (the message says why)."""


def listen(path: str, peer_uid: int, peer_gid: int) -> socket.socket:
    """Bind the spawner's socket at ``path``: only ``peer_uid`` may connect. The
    directory is made (0750, group ``peer_gid``) when missing and must not be a link; a
    socket left at the path by an earlier spawner is replaced, anything else refused."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o750, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{directory} must be a directory of ours that nobody else can write")
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
        else:
            raise OSError(f"{path} exists and is not a socket; not replacing it")
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    if os.geteuid() == 0:
        os.chown(directory, 0, peer_gid)
        os.chmod(directory, 0o750)  # noqa: S103 - the group (the protocol process) must reach the socket
        os.chown(path, peer_uid, peer_gid)
    enable_credentials(listener)
    listener.listen(4)
    return listener


def accept_daemon(listener: socket.socket, peer_uid: int) -> tuple[socket.socket, int] | None:
    """The next connection if it comes from ``peer_uid``: (socket, the peer's pid); None
    (the connection closed) for anyone else."""
    conn, _address = listener.accept()
    enable_credentials(conn)
    pid, uid, _gid = peer_credentials(conn)
    if uid != peer_uid:
        log.warning("refused a connection from pid %d (uid %d): only uid %d is served", pid, uid, peer_uid)
        conn.close()
        return None
    log.info("serving the protocol process %d", pid)
    return conn, pid


def connect(path: str, wait_seconds: float = 10.0) -> tuple[int, socket.socket]:
    """Connect to the spawner at ``path`` (waiting up to ``wait_seconds`` for it to
    appear): (its pid, the socket)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        enable_credentials(sock)  # our frames carry our pid whenever the spawner reads them
        try:
            sock.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if time.monotonic() >= deadline:
                raise SpawnerUnreachable(f"no spawner at {path}: {exc.strerror}") from None
            time.sleep(0.05)
        except OSError as exc:
            sock.close()
            raise SpawnerUnreachable(f"cannot connect to the spawner at {path}: {exc.strerror}") from None
    pid, uid, _gid = peer_credentials(sock)
    if uid not in (0, os.geteuid()):
        sock.close()
        raise SpawnerUnreachable(f"the process at {path} runs as uid {uid}, not root: not a spawner we trust")
    return pid, sock
