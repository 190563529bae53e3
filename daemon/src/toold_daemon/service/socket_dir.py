"""The socket's directory, its lock and its access: never a place someone else could take
the socket from, one daemon per socket, and shared with the socket's group only as far
as asked."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import msgspec


class EndpointInUse(Exception):
    """Another daemon holds the socket's lock."""


class UnsafeRuntimePath(Exception):
    """The socket's directory or lock file is not ours alone (another owner, a symlink,
    writable by others): serving there would let someone else take the socket."""


def check_private_dir(directory: Path, *, exact_mode: int | None = None, heir: int | None = None) -> None:
    """Refuse a directory that is a symlink, belongs to another uid, or that others may
    write to (or, with ``exact_mode``, whose mode is anything else). ``heir``: a uid
    that may own it too (the service user a root start drops to, who got it last time)."""
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimePath(f"{directory} is not a plain directory (a symlink?); refusing to serve there")
    if st.st_uid not in (os.geteuid(), heir):
        raise UnsafeRuntimePath(f"{directory} belongs to uid {st.st_uid}, not to us; refusing to serve there")
    mode = stat.S_IMODE(st.st_mode)
    if (exact_mode is not None and mode != exact_mode) or mode & 0o022:
        wanted = f"{exact_mode:o}" if exact_mode is not None else "writable by its owner only"
        raise UnsafeRuntimePath(f"{directory} has mode {mode:o} (wanted {wanted}); refusing to serve there")


class SocketAccess(msgspec.Struct, frozen=True):
    """The socket's group (None: the daemon's) and mode."""

    gid: int | None = None
    mode: int = 0o600


def share_dir_with_group(directory: Path, gid: int) -> None:
    """Let ``gid``'s members pass through the socket's directory (0710, that group), when
    it is ours to change; anyone else's is left as it is."""
    st = os.lstat(directory)
    if st.st_uid != os.geteuid():
        return
    if st.st_gid != gid:
        os.chown(directory, -1, gid)
    if stat.S_IMODE(st.st_mode) != 0o710:
        os.chmod(directory, 0o710)  # noqa: S103 - traverse only, for the socket's group


def take_lock(path: Path, endpoint: str, *, heir: int | None, gid: int | None) -> int:
    """Make the socket's directory (private; passable by ``gid``, the socket's group) and
    take the lock beside the socket: its descriptor, held while the daemon serves. Raises
    ``EndpointInUse`` while another daemon holds it, ``UnsafeRuntimePath`` for a place
    that is not ours alone."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path.parent, heir=heir)
    if gid is not None:
        share_dir_with_group(path.parent, gid)
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeRuntimePath(f"{lock_path} is a symlink; refusing to write through it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), heir) or st.st_nlink != 1:
        os.close(fd)
        raise UnsafeRuntimePath(f"{lock_path} is not a private regular file of ours; refusing to use it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise EndpointInUse(f"another toold is serving {endpoint} (lock {lock_path})") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
