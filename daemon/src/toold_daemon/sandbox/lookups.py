"""Path lookups the event loop may make without waiting for a filesystem.

The protocol process plans each call on its event loop: it canonicalizes the call's paths
and asks whether a file is there. A lookup the kernel cannot answer from its caches asks
the filesystem, and a filesystem may take as long as it likes: an NFS or sshfs mount whose
server went away, a FUSE server that stopped answering (or was stopped by the user who
mounted it). Measured before this module: one ``read_file`` of a path on a stopped FUSE
disk held every other client's ping for as long as the disk stayed stopped.

While planning runs on the loop, and while a costly plan computes on a thread of the few
kept for that (``from_the_caches_alone``), lookups here are made with
``openat2(RESOLVE_CACHED)``: answered from the kernel's caches or not at all (``EAGAIN``),
and then ``WouldBlock`` is raised and the batch is planned again on a thread where a
lookup may wait (``planning_aside``). A path looked at recently is in the cache, so the
common call stays on the loop. A name the cache does not know in a directory it
does know, below a root on a local disk (``LocalRoot``), is looked up for real: one
lookup there waits for that disk at most, not for another mount (a new file's name, a
command's words; without this each sent its batch to a thread). Elsewhere (on the threads that may wait, in a worker)
these are plain lookups. Without ``RESOLVE_CACHED`` (Linux before 5.12) lookups are plain
everywhere, as before, and the daemon says so once in its log.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import threading

log = logging.getLogger(__name__)

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_SYS_OPENAT2 = 437  # the same number on every architecture (Linux 5.6)
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_CACHED = 0x20  # Linux 5.12
_AT_FDCWD = -100


class WouldBlock(Exception):
    """A lookup would have asked a filesystem, on the event loop: plan on a thread instead."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
# syscall() is variadic and reads each argument as a long: passed as such, not as int.
_HOW_SIZE = ctypes.c_long(ctypes.sizeof(_OpenHow))
_AT_FDCWD_ARG = ctypes.c_long(_AT_FDCWD)
_hows: dict[int, _OpenHow] = {}  # by flags: made once
#: A cached directory below a root, never across a mount (``LocalRoot.canonical_below``).
_HOW_CACHED_DIRECTORY = _OpenHow(
    flags=_O_PATH | os.O_CLOEXEC | os.O_DIRECTORY, mode=0, resolve=_RESOLVE_CACHED | _RESOLVE_NO_XDEV
)
#: A root's directory by its name, cached, with no symlink on it (``LocalRoot``).
_HOW_CACHED_ROOT = _OpenHow(
    flags=_O_PATH | os.O_CLOEXEC | os.O_DIRECTORY, mode=0, resolve=_RESOLVE_CACHED | _RESOLVE_NO_SYMLINKS
)
#: A cached path with no symlink on it (``is_canonical``).
_HOW_CACHED_WITHOUT_LINKS = _OpenHow(
    flags=_O_PATH | os.O_CLOEXEC, mode=0, resolve=_RESOLVE_CACHED | _RESOLVE_NO_SYMLINKS
)
_state = threading.local()
#: False once the kernel has refused ``RESOLVE_CACHED``: lookups are plain from then on.
_cached_lookups = [True]


class _FromTheCachesAlone:
    """Lookups made by this thread meanwhile never wait for a filesystem. (A class: it is
    entered for every batch planned, and costs a third of a generator-based one.)"""

    def __enter__(self) -> None:
        _state.cached_only = True

    def __exit__(self, *exc: object) -> None:
        _state.cached_only = False


_FROM_THE_CACHES_ALONE = _FromTheCachesAlone()


def from_the_caches_alone() -> _FromTheCachesAlone:
    return _FROM_THE_CACHES_ALONE


def must_not_wait() -> bool:
    """Whether a lookup now may not ask a filesystem (see ``from_the_caches_alone``)."""
    return _cached_lookups[0] and getattr(_state, "cached_only", False)


def refuse_to_wait() -> None:
    """Raise ``WouldBlock`` where a lookup may not wait: for the callers whose only way to
    a path is one that may (``os.path.realpath``, a directory listing)."""
    if must_not_wait():
        raise WouldBlock()


def open_path(path: str, flags: int = 0, *, dir_fd: int | None = None) -> int:
    """``os.open(path, O_PATH | O_CLOEXEC | flags)``, from the kernel's caches alone where
    a lookup may not wait. Raises OSError as ``os.open`` does, or ``WouldBlock``."""
    flags |= _O_PATH | os.O_CLOEXEC
    if not (_cached_lookups[0] and getattr(_state, "cached_only", False)):
        return os.open(path, flags, dir_fd=dir_fd)
    how = _hows.get(flags)
    if how is None:
        how = _hows[flags] = _OpenHow(flags=flags, mode=0, resolve=_RESOLVE_CACHED)
    at = _AT_FDCWD_ARG if dir_fd is None else ctypes.c_long(dir_fd)
    fd = _syscall(_SYS_OPENAT2, at, os.fsencode(path), ctypes.byref(how), _HOW_SIZE)
    if fd >= 0:
        return int(fd)
    code = ctypes.get_errno()
    if code == errno.EAGAIN:
        raise WouldBlock()
    if code in (errno.ENOSYS, errno.EINVAL, errno.E2BIG):  # no openat2, or no RESOLVE_CACHED
        _cached_lookups[0] = False
        log.warning(
            "this kernel answers no lookup from its caches alone (openat2 RESOLVE_CACHED, Linux 5.12): "
            "planning on the event loop may wait for a slow filesystem"
        )
        return os.open(path, flags, dir_fd=dir_fd)
    raise OSError(code, os.strerror(code), path)


#: ``statfs`` types of disks a lookup may wait for on the loop: local ones, whose
#: answers come from this machine's own storage (not FUSE, NFS, CIFS, 9p, ...).
LOCAL_FILESYSTEMS = frozenset(
    {
        0xEF53,  # ext2, ext3, ext4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0x858458F6,  # ramfs
        0xF2F52010,  # f2fs
        0x2FC12FC1,  # zfs
        0xCA451A4E,  # bcachefs
        0x794C7630,  # overlayfs (a container's root)
    }
)


def filesystem_type(fd: int) -> int:
    """``fstatfs(fd).f_type``; -1 where it cannot be told. (``os.statvfs`` has no type.)"""
    buffer = ctypes.create_string_buffer(256)  # struct statfs, f_type first
    if _libc.fstatfs(ctypes.c_int(fd), buffer) != 0:
        return -1
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


class LocalRoot:
    """A root on a local disk: where a name the kernel has not cached may be looked up on
    the loop (``canonical_below``, ``real_name_in_root``).

    The root is opened by its name for each lookup, from the kernel's caches, and only
    while that name still names a directory on a local disk: a root held open would
    still be the old directory after the root was moved aside and made anew, and would
    answer for a tree that is no longer the workspace (a file where a link now is). One
    cached lookup that follows nothing and an ``fstat``; anything else is ``WouldBlock``."""

    def __init__(self, path: str, device: int) -> None:
        self.path, self.prefix = path, path.rstrip("/") + "/"
        self._name = os.fsencode(path)
        self._device = device

    def _open_now(self) -> int:
        """The directory the root's name names now, if the kernel's caches know it and it
        lies on the disk the root was found on, a local one (else ``WouldBlock``: looked
        up where a lookup may wait). The disk is told by its device number: while the root's
        disk is mounted no other disk has its number, and a disk mounted over the root
        since (a FUSE server's) has one of its own."""
        fd = _open_cached_without_links(self._name, _HOW_CACHED_ROOT)
        if fd < 0:
            raise WouldBlock()
        if os.fstat(fd).st_dev != self._device:
            os.close(fd)
            raise WouldBlock()
        return fd

    def canonical_below(self, path: str) -> str:
        """The canonical name of ``path`` (below this root) whose directory the kernel
        has cached and whose last name it may not have: that name looked up for real, in
        that directory only. ``WouldBlock`` for anything more (the directory not cached,
        on another mount, or the name a symlink to follow)."""
        parent, name = os.path.split(path[len(self.prefix) :])
        root = self._open_now()
        try:
            how = ctypes.byref(_HOW_CACHED_DIRECTORY)
            parent_fd = _syscall(_SYS_OPENAT2, ctypes.c_long(root), os.fsencode(parent or "."), how, _HOW_SIZE)
        finally:
            os.close(root)
        if parent_fd < 0 or not name:
            if parent_fd >= 0:
                os.close(parent_fd)
            raise WouldBlock()
        try:
            try:
                fd = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
            except FileNotFoundError:
                return os.path.join(os.readlink(f"/proc/self/fd/{parent_fd}"), name)
            except OSError:
                raise WouldBlock() from None
            try:
                # The name is on this local disk: a mount point, the one way onto another
                # disk here, is always in the kernel's cache, so the cached open took it.
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise WouldBlock()
                return os.readlink(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
        finally:
            os.close(parent_fd)

    def real_name_in_root(self, name: str) -> str | None:
        """The canonical name of ``name`` right in this root (no ``/`` in it), unless it
        is a symlink (None: follow it through ``canonical``). Mostly one cached lookup of
        the whole name that follows no link (``_cached_without_links``): there, or known
        to be missing, it is its own canonical name. A name the kernel has not cached is
        looked up in the root its name names now (``_open_now``)."""
        code = _cached_without_links(os.fsencode(self.prefix + name))
        if code in (0, errno.ENOENT):
            return self.prefix + name
        if code != errno.EAGAIN:  # a link on the way (ELOOP), or one that cannot be looked at
            return None
        root = self._open_now()
        try:
            fd = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except FileNotFoundError:
            return self.prefix + name
        except OSError:
            return None
        finally:
            os.close(root)
        try:
            return None if stat.S_ISLNK(os.fstat(fd).st_mode) else self.prefix + name
        finally:
            os.close(fd)


def local_root(path: str) -> LocalRoot | None:
    """``path`` (a canonical root) where it lies on a local disk, else None. Made where
    the root may be looked at (its sandbox is built off the loop)."""
    try:
        fd = os.open(path, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return LocalRoot(path, os.fstat(fd).st_dev) if filesystem_type(fd) in LOCAL_FILESYSTEMS else None
    finally:
        os.close(fd)


def is_canonical(path: str) -> bool:
    """Whether normalised absolute ``path`` is there, known to the kernel's caches, with no
    symlink anywhere on it: it is then its own canonical name. One cached lookup, where
    working the name out takes a lookup and a read of it back from /proc (3.1 against
    7.4 µs here). False for anything else (a symlink on the way, a missing name, one the
    kernel has not cached, a kernel without these lookups): the name is then worked out
    as ever."""
    return _cached_lookups[0] and _cached_without_links(os.fsencode(path)) == 0


def _cached_without_links(path: bytes) -> int:
    """0 when absolute ``path`` is there with no symlink on it, from the kernel's caches
    alone; else the error: ``ENOENT`` missing (the cache knows it is not there),
    ``ELOOP`` a link on the way, ``EAGAIN`` not cached."""
    fd = _open_cached_without_links(path, _HOW_CACHED_WITHOUT_LINKS)
    if fd < 0:
        return -fd
    os.close(fd)
    return 0


def _open_cached_without_links(path: bytes, how: _OpenHow) -> int:
    """``openat2`` of absolute ``path`` by ``how`` (``RESOLVE_CACHED``, no symlinks): the
    fd, or the error negated (returned, not raised: most answers here are "no")."""
    fd = int(_syscall(_SYS_OPENAT2, _AT_FDCWD_ARG, path, ctypes.byref(how), _HOW_SIZE))
    return fd if fd >= 0 else -ctypes.get_errno()


def lexists(path: str, *, dir_fd: int | None = None) -> bool:
    """``os.path.lexists``, from the kernel's caches alone where a lookup may not wait:
    a symlink counts as itself, and a name that cannot be looked at as missing."""
    try:
        fd = open_path(path, os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return False
    os.close(fd)
    return True
