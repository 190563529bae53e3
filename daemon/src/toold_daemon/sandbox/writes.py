"""Symlink-safe, atomic writes beneath a sandbox root.

Every operation first opens the *parent directory* of its target component by
component from the root with ``O_NOFOLLOW | O_DIRECTORY`` (creating missing
directories the same way when asked), then acts on the last component relative to that
directory fd. A symlink swapped in anywhere along the path after validation makes the
walk fail with ``ELOOP``/``ENOTDIR`` instead of leading out of the roots, and a symlink
at the target itself is never followed (it is replaced or refused, not written through).

Writes go to a file of their own in the same directory, are fsynced, take the
original's permission bits, group and extended attributes (its ACLs among them) as far
as the writer may, are renamed over the target, and the directory is fsynced.
That file has no name while its bytes are written (``O_TMPFILE``): a writer killed then
leaves nothing behind. It is linked in under a temp name just before the rename. Where
the filesystem has no unnamed files (or the writer no file descriptor to spare), it is a
named temp file from the start, as a killed writer may leave.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from toold_protocol import ToolErrorType

from ..errors import ToolError, file_exists, from_os_error, sandbox_violation
from . import trees
from .attributes import Attributes, carry_over, give_attributes, take_over
from .paths import Sandbox, open_beneath
from .reads import read_at_most

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
#: What ``open(O_TMPFILE)`` fails with where unnamed files cannot be had: a filesystem
#: without them, a kernel before them, no descriptor to spare (a patch of many files).
_NO_UNNAMED = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EMFILE, errno.ENFILE}
#: What linking an unnamed file in through /proc fails with where that cannot be done (no
#: /proc, a kernel or security module that refuses it): the file is then copied to a named
#: temp file instead, and this process stages named temp files from then on.
#: What fchmod of a file of our own answers on a filesystem whose files have no modes
#: of their own (FAT, exFAT: one mode for the whole mount): EPERM from the kernel's
#: vfat, ENOSYS or EOPNOTSUPP from a FUSE server without chmod.
_NO_MODES = {errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP}
_NO_LINK = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTDIR, errno.ELOOP}
_unnamed = [bool(_O_TMPFILE)]


class Existing(msgspec.Struct, frozen=True):
    data: bytes
    mode: int
    size: int = 0
    #: Too large to be read whole (``read_existing(unread_past=True)``): ``data`` is empty.
    unread: bool = False


#: The largest file a tool reads whole to change it (an edit, a patch, a diff shown for
#: a write). A worker may hold 4 GiB; an edit holds a file three times over (its bytes,
#: its text, the edited text), and a 5 GB file failed with MemoryError.
WHOLE_READ_MAX_BYTES = 64 * 1024 * 1024


@contextmanager
def parent_dir(sandbox: Sandbox, path: Path, *, create: bool = False, shown: str = "") -> Iterator[tuple[int, str]]:
    """Yield (fd of the parent directory, last component) for validated ``path``. With
    ``create``, missing directories on the way are made; should the block fail, those it
    made are removed again when they are still empty (a write that did not happen leaves
    no directory behind)."""
    shown = shown or str(path)
    root = sandbox.root_of(path)
    if root is None:
        raise sandbox_violation("PATH_OUTSIDE_SANDBOX", f"Path is outside the sandbox roots: {shown}")
    relative = path.relative_to(root).parts
    if not relative:
        raise ToolError(ToolErrorType.SANDBOX_VIOLATION, "ROOT_ITSELF", f"{shown} is a sandbox root itself")
    made: list[tuple[str, ...]] = []
    try:
        fd = open_beneath(str(root), relative[:-1], create=create, made=made)
    except OSError as exc:
        _remove_empty(str(root), made)
        raise from_os_error(exc, shown) from None
    try:
        yield fd, relative[-1]
    except BaseException as exc:
        os.close(fd)
        fd = -1
        _remove_empty(str(root), made)
        if isinstance(exc, OSError):
            raise from_os_error(exc, shown) from None
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def _remove_empty(root: str, made: list[tuple[str, ...]]) -> None:
    """Remove the directories ``made`` below ``root``, deepest first, each only while it
    is empty (rmdir), reached a name at a time as they were made."""
    for parts in reversed(made):
        try:
            parent = open_beneath(root, parts[:-1])
        except OSError:
            continue
        try:
            os.rmdir(parts[-1], dir_fd=parent)
        except OSError:
            pass  # not empty (something was put there meanwhile), or gone already
        finally:
            os.close(parent)


def read_existing(
    dir_fd: int, name: str, *, shown: str, sandbox: Sandbox, unread_past: bool = False
) -> Existing | None:
    """The current bytes and mode of a regular file, None if there is none. Never follows
    a symlink; a directory or other kind of file is an error, a hard link to a denied
    file is refused. A file over ``WHOLE_READ_MAX_BYTES`` is ``FILE_TOO_LARGE``, or with
    ``unread_past`` (a write that replaces it whole) comes back unread."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "NOT_A_REGULAR_FILE", f"{shown} is {kind}", path=shown)
        sandbox.refuse_denied_link(st, shown)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_size > WHOLE_READ_MAX_BYTES and unread_past:
            return Existing(b"", mode, st.st_size, unread=True)
        fits = st.st_size <= WHOLE_READ_MAX_BYTES
        data = read_at_most(f.fileno(), WHOLE_READ_MAX_BYTES + 1, st.st_size) if fits else b""
        if len(data) > WHOLE_READ_MAX_BYTES or st.st_size > WHOLE_READ_MAX_BYTES:
            size = max(st.st_size, len(data))
            if unread_past:
                return Existing(b"", mode, size, unread=True)
            raise ToolError(
                ToolErrorType.FILE_TOO_LARGE,
                "FILE_TOO_LARGE",
                f"{shown} is {size} bytes, over the {WHOLE_READ_MAX_BYTES}-byte limit for a file a tool "
                "reads whole to change it; change it with a command instead",
                path=shown,
                size=size,
                limit=WHOLE_READ_MAX_BYTES,
            )
        return Existing(data, mode, len(data))


def exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def atomic_write(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int | None,
    shown: str,
    like: tuple[int, str] | None = None,
    attributes: Attributes | None = None,
) -> None:
    """Write ``data`` to ``name`` in ``dir_fd`` atomically: a file of its own, fsync,
    rename, fsync dir. ``mode`` None means a new file (0666 minus umask); otherwise it
    keeps the group and extended attributes of what it replaces, or of ``like``, or
    gets ``attributes``."""
    staged = stage(dir_fd, name, data, mode=mode, shown=shown, like=like, attributes=attributes)
    put_in_place(dir_fd, staged, name, shown=shown)


class Staged:
    """New content written beside its target and not in place yet: an unnamed file
    (``fd``), or a named temp file (``temp``) where the filesystem has none."""

    __slots__ = ("fd", "temp")

    def __init__(self, fd: int = -1, temp: str = "") -> None:
        self.fd = fd
        self.temp = temp


def stage(
    dir_fd: int,
    name: str,
    data: bytes | int,
    *,
    mode: int | None,
    shown: str,
    like: tuple[int, str] | None = None,
    attributes: Attributes | None = None,
) -> Staged:
    """The first half of ``atomic_write``: ``data`` (bytes, or an open file to copy) in a
    new file beside ``name``, with
    the group and extended attributes of the file it replaces (of ``like``, a directory
    fd and name; or ``attributes`` themselves, when given), fsynced. Where the bytes need
    room (a full disk fails here), so that a writer of several files can stage them all
    before it changes any. Nothing is left behind on failure, nor, for an unnamed file,
    when the writer is killed."""
    fd, temp = _open_staged(dir_fd, name, shown)
    try:
        if isinstance(data, int):
            _copy_from(data, fd)
        else:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        if attributes is not None:
            give_attributes(fd, attributes)
        elif mode is not None:
            take_over(*(like or (dir_fd, name)), fd)
        if mode is not None:
            set_mode(fd, mode)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        if temp:
            _unlink_quietly(dir_fd, temp)
        raise from_os_error(exc, shown) from None
    if temp:
        os.close(fd)
        return Staged(temp=temp)
    return Staged(fd=fd)


def _copy_from(source: int, fd: int) -> None:
    """Every byte of open file ``source`` (from its start) into ``fd``, in the kernel
    where it can (``copy_file_range``), else through a 1 MiB buffer."""
    offset = 0
    try:
        while copied := os.copy_file_range(source, fd, 1 << 30, offset, offset):
            offset += copied
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
            raise
    while chunk := os.pread(source, 1 << 20, offset):
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written


def _open_staged(dir_fd: int, name: str, shown: str) -> tuple[int, str]:
    """A new file in ``dir_fd`` open for writing: unnamed (temp name ""), else a named
    temp file made with ``O_EXCL | O_NOFOLLOW`` (a symlink planted there is refused)."""
    if _unnamed[0]:
        try:
            # read-write: should it not link in, it is copied from (``_linked_in``)
            return os.open(".", _O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666, dir_fd=dir_fd), ""
        except OSError as exc:
            if exc.errno not in _NO_UNNAMED:
                raise from_os_error(exc, shown) from None
    temp = _temp_name(name)
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    return fd, temp


def _temp_name(name: str) -> str:
    return f"{temp_prefix(name)}{secrets.token_hex(6)}.tmp"


def temp_prefix(name: str) -> str:
    """How the names of the temp files of a write to ``name`` begin: within the 255 bytes
    a name may have, whatever the length of ``name`` and its characters'."""
    return f".{clipped(name, 200)}.toold-"


def clipped(name: str, most_bytes: int) -> str:
    """``name``, cut at a character so that its bytes on disk are at most ``most_bytes``
    (a name of 85 CJK characters already takes the 255 bytes a name may have)."""
    if len(name) * 4 <= most_bytes:  # no character takes more than 4 bytes
        return name
    while len(os.fsencode(name)) > most_bytes:
        name = name[:-1]
    return name


def put_in_place(dir_fd: int, staged: Staged, name: str, *, shown: str) -> None:
    """The second half of ``atomic_write``: the staged file renamed over ``name`` (an
    unnamed one first linked in under a temp name; neither needs room for data), then
    the directory fsynced. On failure nothing staged is left."""
    try:
        if staged.fd >= 0:
            staged.temp = _linked_in(dir_fd, staged.fd, name, shown)
            os.close(staged.fd)
            staged.fd = -1
        os.rename(staged.temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        discard_staged(dir_fd, staged)
        raise from_os_error(exc, shown) from None
    os.fsync(dir_fd)


def for_new_contents(mode: int) -> int:
    """The mode a file's new contents take: its own, less setuid, and setgid where the
    group may execute it, as the kernel clears them on any write by a process that may
    not keep them. A write is a new file given the old one's mode: a model's contents in a
    setuid program kept the bit (and, written by a root client over another user's
    setuid program, ran as root). Capabilities go the same way (``attributes``)."""
    if mode & stat.S_IXGRP:
        return mode & ~(stat.S_ISUID | stat.S_ISGID)
    return mode & ~stat.S_ISUID


def set_mode(fd: int, mode: int) -> None:
    """``fchmod``, where the filesystem keeps modes: on one that keeps none (a FAT or
    exFAT disk) a file of our own has the mode every file there has, and a write or an
    undo of a file there goes on without it (before, each failed)."""
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        if exc.errno not in _NO_MODES or os.fstat(fd).st_uid != os.geteuid():
            raise


def _linked_in(dir_fd: int, fd: int, name: str, shown: str) -> str:
    """A temp name in ``dir_fd`` for the unnamed file ``fd``: linked through /proc (an
    unnamed file's only way to a name without privilege), else a copy."""
    temp = _temp_name(name)
    try:
        os.link(f"/proc/self/fd/{fd}", temp, dst_dir_fd=dir_fd, follow_symlinks=True)
        return temp
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    _unnamed[0] = False
    copy, temp = _open_staged(dir_fd, name, shown)
    try:
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):
            offset += len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(copy, view) :]
        carry_over(fd, copy)
        set_mode(copy, stat.S_IMODE(os.fstat(fd).st_mode))
        os.fsync(copy)
    except OSError:
        _unlink_quietly(dir_fd, temp)
        raise
    finally:
        os.close(copy)
    return temp


def discard_staged(dir_fd: int, staged: Staged) -> None:
    """A staged file that will not be put in place."""
    if staged.fd >= 0:
        os.close(staged.fd)  # an unnamed file: gone with its last descriptor
        staged.fd = -1
    if staged.temp:
        _unlink_quietly(dir_fd, staged.temp)
        staged.temp = ""


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def delete(dir_fd: int, name: str, *, recursive: bool, shown: str, prefix: str) -> list[str]:
    """Delete a file, symlink (not its target) or, with ``recursive``, a directory tree.
    Returns the deleted paths (``prefix``-relative, deepest first, at most 1000 listed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise from_os_error(exc, shown) from None
        os.fsync(dir_fd)
        return [prefix]
    if not recursive:
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED,
            "IS_A_DIRECTORY",
            f"{shown} is a directory; pass recursive=true to delete it and everything in it",
            path=shown,
        )
    listed = _list_tree(dir_fd, name, prefix)
    try:
        trees.remove_tree(name, dir_fd=dir_fd)  # fd-based: does not follow symlinks
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    os.fsync(dir_fd)
    return listed


def _list_tree(dir_fd: int, name: str, prefix: str, limit: int = 1000) -> list[str]:
    """Up to ``limit`` of the paths below directory ``name`` (shown under ``prefix``), and
    it: each directory's entries before the directory itself, as they are removed."""
    top = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    blocks: list[list[str]] = []
    count = 0
    try:
        start = f"/proc/self/fd/{top}"
        for directory, dirs, files in trees.walk(start):
            below = os.path.relpath(directory, start)
            base = prefix if below == "." else f"{prefix}/{below}"
            links = [d for d in dirs if os.path.islink(os.path.join(directory, d))]
            block = [*(f"{base}/{entry}" for entry in [*files, *links]), base]
            blocks.append(block)
            count += len(block)
            if count >= limit:
                break
    finally:
        os.close(top)
    return [path for block in reversed(blocks) for path in block][:limit]


def move(
    src_dir: int,
    src_name: str,
    dst_dir: int,
    dst_name: str,
    *,
    overwrite: bool,
    shown_src: str,
    shown_dst: str,
    sandbox: Sandbox,
) -> None:
    """Rename within or across directories; across filesystems copy then delete, so a crash
    in between leaves the source intact (at worst both exist). A source that cannot be
    removed after its copy puts the destination back as it was."""
    if not overwrite and exists(dst_dir, dst_name):
        raise file_exists(shown_dst)
    try:
        os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise from_os_error(exc, shown_src) from None
        _copy_across(src_dir, src_name, dst_dir, dst_name, shown_src=shown_src, shown_dst=shown_dst, sandbox=sandbox)
    os.fsync(dst_dir)
    if src_dir != dst_dir:
        os.fsync(src_dir)


def _copy_across(
    src_dir: int, src_name: str, dst_dir: int, dst_name: str, *, shown_src: str, shown_dst: str, sandbox: Sandbox
) -> None:
    try:
        src = os.open(src_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    except FileNotFoundError:
        raise ToolError(ToolErrorType.FILE_NOT_FOUND, "FILE_NOT_FOUND", f"File not found: {shown_src}") from None
    except OSError as exc:
        raise from_os_error(exc, shown_src) from None
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "NOT_A_REGULAR_FILE",
                f"{shown_src} is not a regular file",
                path=shown_src,
            )
        sandbox.refuse_denied_link(st, shown_src)
        replaced = _kept(dst_dir, dst_name)
        # Copied a piece at a time (a file of gigabytes was read whole into memory first).
        staged = stage(dst_dir, dst_name, src, mode=stat.S_IMODE(st.st_mode), shown=shown_dst, like=(src_dir, src_name))
    finally:
        os.close(src)
    put_in_place(dst_dir, staged, dst_name, shown=shown_dst)
    try:
        os.unlink(src_name, dir_fd=src_dir)
    except OSError as exc:
        # The source stays (its directory is not writable, say): the destination goes back
        # to what it was, so that a move that fails leaves no copy behind.
        put_back(dst_dir, dst_name, replaced)  # the error names the source either way
        raise from_os_error(exc, shown_src) from None


#: What was at a name before a write replaced it, to put back if a later step fails: a
#: regular file's bytes and mode, a symlink's target, None (nothing, or what a write
#: cannot replace: a directory), or ``_TOO_LARGE_TO_KEEP`` (then it is left as it is).
Kept = tuple[bytes, int] | str | None
_TOO_LARGE_TO_KEEP = "\0too large"  # (no symlink target holds a NUL)
#: Bytes of a replaced file held in memory to put it back.
PUT_BACK_MAX_BYTES = 64 << 20


def _kept(dir_fd: int, name: str) -> Kept:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return os.readlink(name, dir_fd=dir_fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > PUT_BACK_MAX_BYTES:
            return _TOO_LARGE_TO_KEEP
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(), stat.S_IMODE(st.st_mode)


def put_back(dir_fd: int, name: str, kept: Kept) -> bool:
    """Put ``kept`` back at ``name`` (best effort, for a step that must be undone because
    a later one failed); whether it is back as it was."""
    if kept == _TOO_LARGE_TO_KEEP:
        return False
    try:
        if kept is None:
            os.unlink(name, dir_fd=dir_fd)
        elif isinstance(kept, str):
            os.unlink(name, dir_fd=dir_fd)
            os.symlink(kept, name, dir_fd=dir_fd)
        else:
            atomic_write(dir_fd, name, kept[0], mode=kept[1], shown=name)
    except (OSError, ToolError):
        return False
    return True
