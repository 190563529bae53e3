"""Pre-images and post-images of the paths a call changes, taken in the user's worker.

Before a mutating tool runs, each path it declares (``Tool.changes``) is read as it is:
a regular file's exact bytes, mode, owner, group and extended attributes, a symlink's target,
a directory (and, for a recursive delete or a moved tree, everything below it), or
"absent". After the tool, each path's new state is hashed. The protocol process stores the bytes
content-addressed and journals the rest, so ``toolctl undo`` can put every path back
and refuse the ones that changed since. Nothing here follows a symlink.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

import msgspec

from ..sandbox.reads import read_at_most
from ..sandbox.trees import walk

Kind = Literal["file", "absent", "dir", "symlink", "unknown"]
MAX_ENTRIES = 10_000  # below one path (a recursive delete): more are "not undoable"
#: Directories brought below a new one get a tree hash of their own down to this depth.
#: Each hash lists a whole subtree: one per directory of a chain a thousand deep took
#: half a million listings, past any call's time limit (the hashes above cover the rest).
TREE_HASH_DEPTH = 8


class Image(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One path's state. ``data`` travels from the worker to the daemon only (the
    journal keeps ``hash``); ``note`` says why the path cannot be put back."""

    path: str
    kind: Kind
    mode: int = 0
    hash: str = ""
    data: bytes = b""
    note: str = ""
    #: A file's or directory's owner, group and extended attributes (its POSIX ACLs among
    #: them), which an undo that makes it again gives back (-1 and none: not taken).
    uid: int = -1
    gid: int = -1
    xattrs: dict[str, bytes] = msgspec.field(default_factory=dict)
    #: Where the call moved this path when its contents were not kept (``note`` says
    #: why): an undo moves it back from there instead of making it again.
    moved_to: str = ""


class Change(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a call did to one path: its state before and after."""

    before: Image
    after_kind: Kind
    after_hash: str = ""
    #: Its permission bits after (files and directories; -1: none to compare).
    after_mode: int = -1


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: Why a file's bytes were not kept: the batch's pre-images had taken the undo bound.
OVER_BOUND = "over the batch's undo bound"
#: The largest file whose state (after a call, or in a tree's hash) is its contents'
#: hash; a larger one's is its inode, size and times (``image_of``).
HASHED_MAX_BYTES = 64 * 1024 * 1024


def capture(
    paths: list[Path],
    budget: int,
    denied: Callable[[str], bool],
    moves: Mapping[Path, Path] | None = None,
) -> tuple[list[Image], int]:
    """The pre-images of ``paths`` (and of everything below a directory among them),
    keeping file bytes while they fit in ``budget``: (images, bytes kept). A file is
    read only once its size says it fits: one larger than what is left is "not undoable"
    unread (before, each was read whole first, and a delete of a 5 GB file failed with
    MemoryError, as did one of a directory holding more than a worker may hold). A
    ``denied`` file (a secret below a deleted directory) is never read: its bytes must
    not leave the workspace, so it is "not undoable".

    ``moves`` maps a path the call moves to where it moves it; its image says where it
    went, and an undo moves it back from there when nothing else changed it since. Such
    a path that cannot be taken whole (past the bound, a denied or unreadable file
    below) gets that one image and no other: a moved tree larger than the bound could not
    be undone at all, and reading it cost up to the bound (its sizes are now weighed
    first, and nothing is read when they are past it)."""
    images: list[Image] = []
    used = 0
    seen: set[str] = set()
    moved_apart = {str(path) for path in moves or {}}  # (a tree above one takes it as its own)
    # Outermost first, and a path taken with a tree above it is not walked again: an
    # undo names every directory of a deep tree, and each walked all below it (a tree
    # 1,300 deep: 845,000 entries listed, past the call's time limit).
    for path in sorted(paths, key=lambda p: str(p).count("/")):
        if str(path) in seen:
            continue
        for image in _missing_parents(path):
            if image.path not in seen:
                seen.add(image.path)
                images.append(image)
        names, not_whole = _names_below(path, denied, moved_apart)
        moved_to = (moves or {}).get(path)
        if moved_to is not None:
            taken, why = _taken_whole(names, not_whole, budget - used, denied)
            seen.update(names)
            if why:
                images.append(Image(path=str(path), kind="unknown", note=why, moved_to=str(moved_to)))
            else:  # (its top says where it went: an undo may still move it back)
                images += [msgspec.structs.replace(taken[0], moved_to=str(moved_to)), *taken[1:]]
                used += sum(len(image.data) for image in taken)
            continue
        for index, name in enumerate(names):
            if name in seen:
                continue
            seen.add(name)
            if index == 0 and not_whole:
                # The top of a tree not all of whose entries were taken is marked not
                # undoable, with why, so the undo says so; the entries taken are still
                # put back. (A marker beside the top's own image was dropped as a second
                # image of the same path, and such an undo put back part of the tree and
                # called itself complete.)
                image = Image(path=name, kind="unknown", note=not_whole)
            else:
                image = _image_unless_denied(name, denied, max_bytes=budget - used)
            used += len(image.data)
            images.append(image)
    return images, used


def _taken_whole(names: list[str], not_whole: str, left: int, denied: Callable[[str], bool]) -> tuple[list[Image], str]:
    """The images of a moved tree, every one with its contents; or why it cannot be taken
    so (its sizes are weighed before anything is read)."""
    if not_whole:
        return [], not_whole
    size = 0
    for name in names:
        if denied(name) or not _named_in_utf8(name):
            return [], f"{name}: {_image_unless_denied(name, denied).note}"
        try:
            st = os.lstat(name)
        except OSError:
            continue  # (gone meanwhile: its image says so)
        size += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if size > left:
            return [], OVER_BOUND
    taken: list[Image] = []
    for name in names:  # (a file that cannot be read, or has grown past the bound, spoils the lot)
        image = image_of(name, max_bytes=left)
        if image.note:
            return [], f"{name}: {image.note}"
        left -= len(image.data)
        taken.append(image)
    return taken, ""


def _missing_parents(path: Path) -> list[Image]:
    """The directories above ``path`` that do not exist yet, outermost first: a call that
    writes ``a/b/c.txt`` makes them, and its undo must take them away again."""
    missing: list[Image] = []
    parent = path.parent
    while parent != parent.parent and not os.path.lexists(parent):
        missing.append(Image(path=str(parent), kind="absent"))
        parent = parent.parent
    return missing[::-1]


def _names_below(path: Path, denied: Callable[[str], bool], apart: set[str]) -> tuple[list[str], str]:
    """``path``, then (for a directory) every entry below it but those ``apart`` and what
    is below them, parents first; and why the tree could not be taken whole ("" when it
    could). Names only: nothing is read yet."""
    top = str(path)
    try:
        is_dir = stat.S_ISDIR(os.lstat(top).st_mode) and not denied(top) and _named_in_utf8(top)
    except OSError:
        is_dir = False
    if not is_dir:
        return [top], ""
    names = [top]
    unread: list[OSError] = []
    for directory, dirs, files in walk(path, onerror=unread.append):
        dirs[:] = sorted(name for name in dirs if os.path.join(directory, name) not in apart)
        for name in [*sorted(name for name in files if os.path.join(directory, name) not in apart), *dirs]:
            if len(names) >= MAX_ENTRIES:
                return names, f"more than {MAX_ENTRIES} entries below"
            names.append(os.path.join(directory, name))
    if unread:  # (a directory below that may not be listed, or past PATH_MAX)
        error = unread[0]
        count = f"{len(unread)} director{'y' if len(unread) == 1 else 'ies'}"
        return names, f"{count} below could not be read ({error.strerror or error}: {error.filename})"
    return names, ""


def _image_unless_denied(path: str, denied: Callable[[str], bool], *, max_bytes: int | None = None) -> Image:
    if denied(path):
        return Image(path=path, kind="unknown", note="a denied file: its content is not kept")
    if not _named_in_utf8(path):
        # Its name reaches the daemon with each such byte as U+FFFD: put back by that
        # name, it would be another file.
        return Image(path=path, kind="unknown", note="its name is not UTF-8: it cannot be put back by name")
    return image_of(path, max_bytes=max_bytes)


def _named_in_utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def image_of(path: str, *, attributes: bool = True, max_bytes: int | None = None) -> Image:
    """``path``'s state, never following a symlink; without ``attributes``, its group and
    extended attributes are not read (a state compared, never put back). A regular file
    of more than ``max_bytes`` is not read: "not undoable", over the undo bound."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # (a path below a file is not there either)
        return Image(path=path, kind="absent")
    except OSError as exc:
        return Image(path=path, kind="unknown", note=f"cannot be read: {exc.strerror}")
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        target = os.fsencode(os.readlink(path))
        return Image(path=path, kind="symlink", hash=digest(target), data=target)
    if stat.S_ISDIR(st.st_mode):
        xattrs = _attributes(path) if attributes else {}
        if xattrs is None:
            return Image(path=path, kind="unknown", note=_TOO_MANY_ATTRIBUTES)
        return Image(path=path, kind="dir", mode=mode, uid=st.st_uid, gid=st.st_gid, xattrs=xattrs)
    if not stat.S_ISREG(st.st_mode):
        return Image(path=path, kind="unknown", note="not a regular file, directory or symlink")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        return Image(path=path, kind="unknown", note=f"cannot be read: {exc.strerror}")
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        known = _known_digests.get()
        key = (opened.st_dev, opened.st_ino, opened.st_size, opened.st_mtime_ns, opened.st_ctime_ns)
        if not attributes and known is not None and key in known:
            return Image(path=path, kind="file", mode=mode, hash=known[key])
        if not attributes and opened.st_size > HASHED_MAX_BYTES:
            # A state compared, never put back: past what is worth reading to hash (a
            # 5 GB file was read whole, and moving it failed with MemoryError), the file
            # is known by its inode, size and times. Its ctime changes with any change
            # to it, and no one may set it.
            identity = f"stat:{opened.st_ino}:{opened.st_size}:{opened.st_mtime_ns}:{opened.st_ctime_ns}"
            return Image(path=path, kind="file", mode=mode, hash=identity)
        if max_bytes is not None and opened.st_size > max_bytes:
            return Image(path=path, kind="unknown", note=OVER_BOUND)
        # (in reads of its size: ``f.read(n)`` allocates n bytes first, 64 MiB per file)
        data = f.read() if max_bytes is None else read_at_most(f.fileno(), max_bytes + 1, opened.st_size)
        if max_bytes is not None and len(data) > max_bytes:  # (it grew meanwhile)
            return Image(path=path, kind="unknown", note=OVER_BOUND)
        xattrs = _attributes(f.fileno()) if attributes else {}
    if xattrs is None:
        return Image(path=path, kind="unknown", note=_TOO_MANY_ATTRIBUTES)
    hash_ = digest(data)
    if known is not None:
        known[key] = hash_
    return Image(path=path, kind="file", mode=mode, hash=hash_, data=data, uid=st.st_uid, gid=st.st_gid, xattrs=xattrs)


_known_digests: ContextVar[dict[tuple[int, int, int, int, int], str] | None] = ContextVar("known_digests", default=None)


@contextmanager
def remembering_digests() -> Iterator[None]:
    """Within it, a file's content hash is remembered by what the file is (device, inode,
    size, modification and change times): a tree a call moves is not hashed again to
    know its state after the move (a rename changes none of that below its top), nor
    before an undo's checks. 40 MB moved: three reads and hashes of it, now one. A
    change in between changes the file's ctime, so it is read again; one hidden by the
    clock's coarse tick could only make a later undo see a change where none was made."""
    token = _known_digests.set({})
    try:
        yield
    finally:
        _known_digests.reset(token)


#: Bytes of extended attributes (names and values) kept for one path: an ACL takes tens.
MAX_ATTRIBUTE_BYTES = 16 << 10
_TOO_MANY_ATTRIBUTES = f"its extended attributes take more than {MAX_ATTRIBUTE_BYTES >> 10} KiB"


def _attributes(target: int | str) -> dict[str, bytes] | None:
    """The extended attributes of an open file (an fd) or of a directory (a path, never
    followed), as far as the reader may read them ({} on a filesystem without them);
    None past ``MAX_ATTRIBUTE_BYTES``."""
    follow = not isinstance(target, str)
    try:
        names = os.listxattr(target, follow_symlinks=follow)
    except OSError:
        return {}
    found: dict[str, bytes] = {}
    size = 0
    for name in names:
        try:
            value = os.getxattr(target, name, follow_symlinks=follow)
        except OSError:
            continue  # one this reader may not read (trusted.*): it is not its to give back
        size += len(name) + len(value)
        if size > MAX_ATTRIBUTE_BYTES:
            return None
        found[name] = value
    return found


def state_of(path: str) -> tuple[Kind, str]:
    """A path's kind and content hash now; a directory's hash covers the names, kinds and
    contents of everything below it ("" past ``MAX_ENTRIES``: not compared)."""
    kind, hash_, _mode = state_and_mode_of(path)
    return kind, hash_


def state_and_mode_of(path: str, *, tree: bool = True, by_identity: bool = False) -> tuple[Kind, str, int]:
    """``state_of`` and the path's own permission bits (-1 for what has none to compare:
    a symlink, or nothing there). A directory's tree hash covers the modes below it, not
    its own; without ``tree`` it is not computed ("": a walk of everything below, which
    an undo asking only a directory's kind made once per directory of a deep tree).
    ``by_identity``: the tree's hash is of what its entries are, not what they hold
    (``identity_tree_digest``)."""
    image = image_of(path, attributes=False)
    mode = image.mode if image.kind in ("file", "dir") else -1
    if image.kind == "dir":
        if not tree:
            return "dir", "", mode
        return "dir", identity_tree_digest(path) if by_identity else tree_digest(path), mode
    return image.kind, image.hash, mode


#: How a tree hash of entries' identities begins (a content hash is bare hex).
IDENTITY_TREE = "identity-tree:"
#: The most entries such a hash lists ("" past it: not compared); it reads no file.
IDENTITY_TREE_MAX_ENTRIES = 100_000


def identity_tree_digest(path: str) -> str:
    """One hash of a directory tree from each entry's relative path, kind, mode, inode,
    size, modification and change times, reading no file: the state of a tree an undo
    moves back whole. Its contents' hash read every file: moving a directory of 18 GB
    ran past the call's time limit after the move was made, and the call said it had
    failed. Any change to an entry changes its ctime, which no one may set."""
    digest_ = _tree_hash(path, _identity, IDENTITY_TREE_MAX_ENTRIES)
    return IDENTITY_TREE + digest_ if digest_ else ""


def tree_digest(path: str) -> str:
    """One hash of a directory tree: each entry's relative path, kind, mode and content."""
    return _tree_hash(path, _contents, MAX_ENTRIES)


def _identity(full: str) -> str:
    try:
        st = os.lstat(full)
    except OSError:
        return "gone"
    return f"{st.st_mode:o}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _contents(full: str) -> str:
    entry = image_of(full, attributes=False)
    return f"{entry.kind}\0{entry.mode}\0{entry.hash}"


def _tree_hash(path: str, describe: Callable[[str], str], max_entries: int) -> str:
    """The hash of every entry below ``path`` (its relative path and ``describe`` of it),
    in a fixed order; "" past ``max_entries`` (not compared)."""
    h = hashlib.sha256()
    count = 0
    cut = len(os.path.join(path, ""))  # (a canonical path: its entries' paths start so)
    for directory, dirs, files in walk(path):
        dirs.sort()
        for name in [*sorted(files), *dirs]:
            count += 1
            if count > max_entries:
                return ""
            full = os.path.join(directory, name)
            h.update(f"{full[cut:]}\0{describe(full)}\n".encode())
    return h.hexdigest()


def changes_after(before: list[Image]) -> list[Change]:
    """Each pre-image with its path's state now. A directory that was not there before
    (a moved directory's destination) also gets a change for every entry now below it,
    each absent before: the undo then knows each of them by name and state, and can
    tell what the batch brought from what someone added later."""
    changed: list[Change] = []
    known = {image.path for image in before}
    # (a tree an undo moves back whole needs no change for each entry in it)
    moved_whole = {image.moved_to for image in before if image.moved_to and image.kind == "unknown"}
    for image in before:
        by_identity = _holds_any(image.path, moved_whole)  # (a directory made for one too)
        after_kind, after_hash, after_mode = state_and_mode_of(image.path, by_identity=by_identity)
        changed.append(Change(before=image, after_kind=after_kind, after_hash=after_hash, after_mode=after_mode))
        if image.kind == "absent" and after_kind == "dir" and image.path not in moved_whole:
            changed += _brought_below(image.path, known, moved_whole)
    return changed


def _holds_any(path: str, tops: set[str]) -> bool:
    """Whether ``path`` is one of ``tops`` or holds one of them."""
    prefix = path.rstrip("/") + "/"
    return any(top == path or top.startswith(prefix) for top in tops)


def _brought_below(path: str, known: set[str], moved_whole: set[str]) -> list[Change]:
    """A change (absent before) for each entry below ``path`` not already known, and not
    in a tree moved whole; none past ``MAX_ENTRIES`` (the directory's tree hash still
    covers them)."""
    brought: list[Change] = []
    for directory, dirs, files in walk(path):
        dirs[:] = sorted(name for name in dirs if os.path.join(directory, name) not in moved_whole)
        for name in [*sorted(files), *dirs]:
            full = os.path.join(directory, name)
            if full in known:
                continue
            if len(brought) >= MAX_ENTRIES:
                return []
            known.add(full)
            if full.count("/", len(path)) <= TREE_HASH_DEPTH:
                kind, hash_, mode = state_and_mode_of(full, by_identity=_holds_any(full, moved_whole))
            else:
                image = image_of(full, attributes=False)  # a directory: no tree hash, the ones above cover it
                kind, hash_, mode = image.kind, image.hash, image.mode if image.kind in ("file", "dir") else -1
            absent = Image(path=full, kind="absent")
            brought.append(Change(before=absent, after_kind=kind, after_hash=hash_, after_mode=mode))
    return brought
