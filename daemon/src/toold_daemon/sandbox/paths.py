"""Path validation and symlink-safe opening.

``Sandbox.resolve`` turns a path written by a model into a canonical absolute path
inside one of the roots, or raises a SandboxViolation. It touches the filesystem
only to canonicalize the deepest existing ancestor.

``Sandbox.open`` then opens that path one component at a time from the root's
directory with ``O_NOFOLLOW``: the canonical path has no symlinks, so a symlink met
there was swapped in after validation, and the open fails with ``ELOOP`` instead of
following it out of the roots.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from pathlib import Path

from ..errors import bad_args, from_os_error, sandbox_violation
from ..globmatch import glob_regex, last_name_glob
from .denied_tree import denied_inodes
from .homes import HOME_DOTFILES, home_directories, home_dotfile
from .lookups import LocalRoot, WouldBlock, is_canonical, local_root, open_path, refuse_to_wait

# Tests only: with TOOLD_TEST_UNCHECKED_PATHS=1 in the daemon's environment, resolving
# is lexical and opening follows symlinks, so a test can show that the kernel layer of
# the tool workers (Landlock on the roots) holds on its own. ``toold serve`` warns loudly.
UNCHECKED_FOR_TESTS = os.environ.get("TOOLD_TEST_UNCHECKED_PATHS") == "1"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _folded_source(pattern: str) -> str:
    """The regex source matching ``pattern`` whatever the case of the names it meets.
    Denied and protected patterns match names whatever their case: they are compiled
    casefolded, and a path is casefolded before it is matched. A directory may fold case
    (ext4 and tmpfs ``casefold``, vfat, exfat, a host folder shared into a VM): there
    ``.ENV`` opens ``.env``, ``.GIT/hooks`` is ``.git/hooks``, and Unicode folds more
    onto ASCII (KELVIN SIGN to ``k``, LONG S and ``ß`` to ``s``). Nothing the daemon can
    ask cheaply says which directories fold; refusing ``.ENV`` where it is a file of its
    own is the price. (``casefold`` then a plain match costs a walk ~60 ns a name, where
    ``re.IGNORECASE`` cost 360 and misses ``ß``.)"""
    return glob_regex(pattern.casefold())


class FirstMatch:
    """Which of several patterns matches a (casefolded) subject first, in one pass of one
    regex: each pattern's regex in a group of its own, in order, so the group that took
    the match names the pattern (the translated globs hold no groups). Compiled once per
    list of patterns, not per sandbox: every session and worker builds one."""

    __slots__ = ("_match", "patterns")

    def __init__(self, patterns: tuple[str, ...], regex: re.Pattern[str] | None) -> None:
        self.patterns = patterns
        self._match = regex.match if regex is not None else None

    @classmethod
    @functools.lru_cache(maxsize=64)
    def of(cls, patterns: tuple[str, ...], globs: tuple[str, ...]) -> FirstMatch:
        """``patterns`` as written, ``globs`` what each matches (same order)."""
        if not patterns:
            return cls(patterns, None)
        regex = re.compile("|".join(f"({_folded_source(glob)})" for glob in globs), re.DOTALL)
        assert regex.groups == len(patterns), "a translated glob holds a capturing group"
        return cls(patterns, regex)

    def first(self, subject: str) -> str | None:
        if self._match is None:
            return None
        found = self._match(subject)
        return self.patterns[found.lastindex - 1] if found is not None and found.lastindex else None


def _names_first(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One regex over a bare name that every name of a path matching one of ``patterns``
    matches (see ``last_name_glob``); None when some pattern allows no such check."""
    names = [last_name_glob(p) for p in patterns]
    if not names or any(name is None for name in names):
        return None
    return re.compile("|".join(f"(?:{_folded_source(name)})" for name in names if name), re.DOTALL)


def _canonical(path: str) -> str:
    """The kernel's canonical name for ``path``: for an existing path, opened with O_PATH and read
    back from /proc (two syscalls); for one that is missing, its deepest existing directory's
    name with the rest appended (see ``_canonical_missing``); otherwise (or without /proc)
    ``os.path.realpath``, which canonicalizes the deepest existing ancestor and appends the rest.
    On the event loop, lookups come from the kernel's caches or raise ``WouldBlock``."""
    known = _missing_known.get()
    if known is not None and path in known:
        return known[path]  # missing when the plan began
    try:
        fd = open_path(path)
    except FileNotFoundError:
        return _canonical_missing(path)
    except OSError:
        refuse_to_wait()
        return os.path.realpath(path)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        refuse_to_wait()
        return os.path.realpath(path)
    finally:
        os.close(fd)


#: Within ``remembering_missing()``: the canonical names of missing paths worked out so
#: far, by the path asked. An undo's plan names every directory of a tree that is gone,
#: and each was walked up to the deepest one that exists: for a tree 1,300 deep, 845,000
#: lookups, past the call's time limit. Each is now walked up only as far as one known.
_missing_known: ContextVar[dict[str, str] | None] = ContextVar("missing_known", default=None)
#: Within ``remembering_missing()`` too: the canonical names of the directories found to
#: exist on the way, by the path asked. A command's words are mostly missing names in one
#: directory (``git status --short``): each then costs two lookups, not four.
_dirs_known: ContextVar[dict[str, str] | None] = ContextVar("dirs_known", default=None)


def remembering_missing() -> _RememberingMissing:
    """Remember the canonical names of missing paths, and of the directories above them,
    until the block ends: for one batch's plan, or one undo's checks, where nothing the
    plan names is made meanwhile."""
    return _RememberingMissing()


class _RememberingMissing:
    """(A class: it is entered for every batch planned, and costs a third of a
    generator-based context manager.)"""

    __slots__ = ("_tokens",)

    def __enter__(self) -> None:
        self._tokens = (_missing_known.set({}), _dirs_known.set({}))

    def __exit__(self, *exc: object) -> None:
        missing, dirs = self._tokens
        _dirs_known.reset(dirs)
        _missing_known.reset(missing)


def _canonical_missing(path: str) -> str:
    """``os.path.realpath`` of a ``path`` the kernel says is missing (a new file, mostly), in a
    few syscalls where realpath takes an lstat per component: the deepest ancestor that opens,
    read back from /proc, and the rest appended. Only when the first missing name is truly
    absent; a dangling symlink there (realpath follows it) or any other error goes to realpath."""
    known = _missing_known.get()
    dirs = _dirs_known.get()
    walked: list[str] = []  # the missing paths walked up from, deepest first
    missing: list[str] = []
    head = path
    while head not in ("/", ""):
        walked.append(head)
        head, name = os.path.split(head)
        missing.append(name)
        if known is not None and head in known:
            return _remember(known, known[head], walked)
        real_head = dirs.get(head) if dirs is not None else None
        if real_head is not None:
            if not _absent(os.path.join(head, name)):
                break  # the name is there now: a dangling symlink, or a race
        else:
            try:
                fd = open_path(head, os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            except OSError:
                break
            try:
                if not _absent(name, dir_fd=fd):
                    break  # the name is there now: a dangling symlink, or a race
                real_head = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                break  # no /proc
            finally:
                os.close(fd)
            if dirs is not None:
                dirs[head] = real_head
        if known is not None:
            return _remember(known, real_head, walked)
        missing.reverse()
        return os.path.join(real_head, *missing)
    refuse_to_wait()
    return os.path.realpath(path)


def _remember(known: dict[str, str], real_head: str, walked: list[str]) -> str:
    """The canonical names of ``walked`` (missing paths, deepest first, each the parent's
    child) below ``real_head``, the canonical name of the parent of the outermost; the
    deepest's is returned."""
    canonical = real_head
    for path in reversed(walked):
        canonical = known[path] = os.path.join(canonical, os.path.basename(path))
    return canonical


def _absent(path: str, *, dir_fd: int | None = None) -> bool:
    """Nothing at ``path`` (relative to ``dir_fd``), not even a dangling symlink: one lookup."""
    try:
        os.close(open_path(path, os.O_NOFOLLOW, dir_fd=dir_fd))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


class Sandbox:
    def __init__(
        self,
        roots: Sequence[Path | str],
        *,
        denied_patterns: Iterable[str] = (),
        protected_patterns: Iterable[str] = (),
        protect_homes: bool = False,
        allow_absolute: bool = False,
        verified: bool = True,
    ) -> None:
        """``verified`` false: the roots are canonical already, checked by someone who can
        see them (the client's worker, for a workspace the daemon's own user cannot
        traverse); they are taken as given."""
        if not roots:
            raise ValueError("a sandbox needs at least one root")
        canonical: list[Path] = []
        for root in roots:
            if not verified:
                canonical.append(Path(os.path.normpath(root)))
                continue
            real = Path(os.path.realpath(root))
            if not real.is_dir():
                raise ValueError(f"sandbox root is not a directory: {root}")
            canonical.append(real)
        self.roots: tuple[Path, ...] = tuple(canonical)
        self._local_roots: list[LocalRoot | None] = [local_root(str(r)) if verified else None for r in self.roots]
        self.working_dir = self.roots[0]
        self._working_dir_str = str(self.working_dir)
        # Canonical roots compared as strings with a trailing separator: "/r/" is not a prefix of "/r-evil".
        self._root_prefixes = [(str(r), str(r).rstrip("/") + "/") for r in self.roots]
        self.allow_absolute = allow_absolute
        self.denied_patterns: tuple[str, ...] = tuple(dict.fromkeys(denied_patterns))
        # Absolute patterns ("/srv/secrets/**") match the absolute path; the others match the
        # path relative to its root, which is shorter and so cheaper to match on every call.
        absolute = tuple(p for p in self.denied_patterns if p.startswith("/"))
        relative = tuple(p for p in self.denied_patterns if not p.startswith("/"))
        self._denied_abs = FirstMatch.of(absolute, tuple(p.lstrip("/") for p in absolute))
        self._denied_rel = FirstMatch.of(relative, relative)
        self.protected_patterns: tuple[str, ...] = tuple(dict.fromkeys(protected_patterns))
        self._protected = FirstMatch.of(self.protected_patterns, self.protected_patterns)
        #: Dot-entries directly in any home directory are protected too (``HOME_DOTFILES``).
        self.protect_homes = protect_homes
        self._denied_names = _names_first(p.lstrip("/") for p in self.denied_patterns)
        self._protected_names = _names_first(self.protected_patterns)
        for root in self.roots:
            # Relative patterns see paths relative to the root, so a root *inside* a denied
            # location (say ~/.ssh) would escape them: refuse such a root outright.
            inside = (root / "probe").as_posix().lstrip("/").casefold()
            hit = self._denied_rel.first(inside)
            if hit is not None:
                raise ValueError(f"sandbox root {root} lies inside a location denied by pattern {hit}")

    # ------------------------------------------------------------------ validation

    def resolve(self, raw: str, *, base: Path | None = None, follow_last: bool = True) -> Path:
        """Validate ``raw`` and return its canonical absolute path. With ``follow_last``
        false the last component is the entry itself (a symlink stays the link): only
        its directory is canonicalised, for tools that act on the entry (delete, move)."""
        if not raw:
            raise bad_args("path must not be empty")
        if "\x00" in raw:
            raise bad_args("path must not contain NUL bytes")
        if raw.startswith("/") and not self.allow_absolute:
            raise sandbox_violation(
                "ABSOLUTE_PATH",
                f"Absolute paths are not allowed: {raw} (use a path relative to the root)",
                attempted=raw,
            )
        if ".." in raw.split("/"):
            raise sandbox_violation("PATH_TRAVERSAL", f"Path must not contain '..': {raw}", attempted=raw)
        candidate = os.path.normpath(os.path.join(base or self._working_dir_str, raw))
        if UNCHECKED_FOR_TESTS:
            return Path(candidate)
        try:
            if follow_last and candidate != "/":
                resolved = self._canonical_normalised(candidate)
            else:
                head, name = os.path.split(candidate)
                resolved = (
                    os.path.join(self._canonical_normalised(head), name)
                    if name
                    else self._canonical_normalised(candidate)
                )
        except OSError as exc:  # the path changed while it was being resolved (a racing rename)
            raise from_os_error(exc, raw) from None
        if self._root_of_str(resolved) is None:
            raise sandbox_violation(
                "PATH_OUTSIDE_SANDBOX",
                f"Path is outside the sandbox roots: {raw}",
                attempted=raw,
                resolved=resolved,
            )
        pattern = self.denied_pattern(resolved)
        if pattern is not None:
            raise sandbox_violation(
                "DENIED_PATTERN",
                f"Access to {raw} is denied by pattern {pattern}",
                attempted=raw,
                pattern=pattern,
            )
        return Path(resolved)

    def _canonical_normalised(self, path: str) -> str:
        """``canonical`` of a normalised absolute ``path``: the path itself when no symlink
        is on it (``is_canonical``)."""
        return path if is_canonical(path) else self.canonical(path)

    def canonical(self, path: str) -> str:
        """``os.path.realpath`` of absolute ``path``; on the event loop from the kernel's
        caches, or with one real lookup of a name in a cached directory below a root on a
        local disk, else ``WouldBlock`` (``sandbox.lookups``)."""
        try:
            return _canonical(path)
        except WouldBlock:
            index = self._root_index(path)
            local = self._local_roots[index] if index is not None else None
            if local is None or path == local.path:
                raise
            return local.canonical_below(path)

    def local_root_at(self, directory: str) -> LocalRoot | None:
        """The root on a local disk whose canonical name is ``directory``, if any."""
        index = self._root_index(directory)
        local = self._local_roots[index] if index is not None else None
        return local if local is not None and local.path == directory else None

    def root_of(self, path: Path | str) -> Path | None:
        """The root that contains canonical ``path``, compared by components (``/r-evil`` is not in ``/r``)."""
        index = self._root_index(str(path))
        return None if index is None else self.roots[index]

    def _root_of_str(self, path: str) -> Path | None:
        index = self._root_index(path)
        return None if index is None else self.roots[index]

    def _root_index(self, path: str) -> int | None:
        for index, (root, prefix) in enumerate(self._root_prefixes):
            if path == root or path.startswith(prefix):
                return index
        return None

    def may_be_denied(self, name: str) -> bool:
        """False when no path ending in ``name`` (nor a directory ``name``'s contents)
        can be denied: the check a walk makes on every entry before building its path."""
        if not self.denied_patterns:
            return False
        return self._denied_names is None or self._denied_names.match(name.casefold()) is not None

    def may_be_protected(self, name: str) -> bool:
        """As ``may_be_denied``, for the protected patterns and a home's dot-entries."""
        if self.protect_homes and name.startswith("."):
            return True
        if not self.protected_patterns:
            return False
        return self._protected_names is None or self._protected_names.match(name.casefold()) is not None

    def name_screen(self, *, protected: bool) -> Callable[[str], object] | None:
        """One test a walk makes on each entry's name: falsy when neither ``may_be_denied``
        nor (with ``protected``) ``may_be_protected`` could hold for it. None when every
        name needs a closer look (some pattern allows no check on a bare name)."""
        screens: list[str] = []
        if self.denied_patterns:
            if self._denied_names is None:
                return None
            screens.append(self._denied_names.pattern)
        if protected and self.protected_patterns:
            if self._protected_names is None:
                return None
            screens.append(self._protected_names.pattern)
        if protected and self.protect_homes:
            screens.append(r"\.")
        if not screens:
            return lambda name: False
        match = re.compile("|".join(f"(?:{screen})" for screen in screens), re.DOTALL).match
        return lambda name: match(name.casefold())

    def denied_pattern(self, path: Path | str) -> str | None:
        """The first denied pattern matching canonical ``path``, or None."""
        text = path if isinstance(path, str) else str(path)
        index = self._root_index(text)
        rel = (
            text[len(self._root_prefixes[index][1]) :]
            if index is not None and text != self._root_prefixes[index][0]
            else text.lstrip("/")
        )
        return self._denied_rel.first(rel.casefold()) or self._denied_abs.first(text.lstrip("/").casefold())

    def refuse_denied_link(self, st: os.stat_result, shown: str) -> None:
        """Refuse a regular file that is another name (a hard link) of a denied file
        below the roots: the name check alone would let ``notes.txt`` read ``.env``."""
        if (
            st.st_nlink > 1
            and stat.S_ISREG(st.st_mode)
            and self.denied_patterns
            and (st.st_dev, st.st_ino) in denied_inodes(self)
        ):
            message = f"Access to {shown} is denied: it is a hard link to a denied file"
            raise sandbox_violation("DENIED_PATTERN", message, attempted=shown)

    def protected_pattern(self, path: Path | str) -> str | None:
        """The first protected pattern matching canonical ``path`` (relative to its root),
        or ``HOME_DOTFILES`` for a home's dot-entry: a place other programs run code from,
        which built-in writes ask about."""
        text = str(path)
        index = self._root_index(text)
        if index is None or text == self.roots[index].as_posix():
            return None
        if self.protect_homes and home_dotfile(text, home_directories()) is not None:
            return HOME_DOTFILES
        rel = text[len(self._root_prefixes[index][1]) :].casefold()
        return self._protected.first(rel)

    def display(self, path: Path | str) -> str:
        """Canonical ``path`` as shown to the model: relative to the first root, else absolute."""
        text = str(path)
        index = self._root_index(text)
        if index is None or (index != 0 and len(self.roots) > 1):
            return text
        return text[len(self._root_prefixes[0][1]) :] if text != self._root_prefixes[0][0] else "."

    # ------------------------------------------------------------------ symlink-safe opening

    def open(self, path: Path, flags: int = os.O_RDONLY, *, display: str | None = None) -> int:
        """Open validated ``path`` beneath its root, refusing symlinks on the way. Returns an fd."""
        return self._open(path, flags, display)[0]

    def open_and_stat(
        self, path: Path, flags: int = os.O_RDONLY, *, display: str | None = None
    ) -> tuple[int, os.stat_result]:
        """``open``, and what ``fstat`` says of the file opened (taken to check it anyway:
        a caller that needs it is spared a second one)."""
        fd, st = self._open(path, flags, display)
        if st is None:
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
        return fd, st

    def _open(self, path: Path, flags: int, display: str | None) -> tuple[int, os.stat_result | None]:
        """The fd, and the file's ``fstat`` where it was taken (a file below a root)."""
        text = str(path)
        shown = display or text
        if UNCHECKED_FOR_TESTS:
            try:
                return os.open(text, flags | os.O_CLOEXEC), None
            except OSError as exc:
                raise from_os_error(exc, shown) from None
        index = self._root_index(text)
        if index is None:
            raise sandbox_violation("PATH_OUTSIDE_SANDBOX", f"Path is outside the sandbox roots: {shown}")
        root, prefix = self._root_prefixes[index]
        parts = text[len(prefix) :].split("/") if text != root else []
        try:
            fd = open_beneath(root, parts[:-1])
        except OSError as exc:
            raise from_os_error(exc, shown) from None
        if not parts:
            return fd, None
        try:
            opened = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise from_os_error(exc, shown) from None
        finally:
            os.close(fd)
        try:
            st = os.fstat(opened)
            self.refuse_denied_link(st, shown)
        except BaseException:
            os.close(opened)
            raise
        return opened, st

    def open_dir(self, path: Path, *, display: str | None = None) -> int:
        return self.open(path, os.O_RDONLY | os.O_DIRECTORY, display=display)


def open_beneath(
    root: str, parts: Sequence[str], *, create: bool = False, made: list[tuple[str, ...]] | None = None
) -> int:
    """The directory ``root/parts...`` opened one component at a time with ``O_NOFOLLOW``
    (a symlink anywhere on the way is ``ELOOP``/``ENOTDIR``, never followed), creating
    missing ones when ``create`` (each one this call made is added to ``made``, as its
    parts below ``root``). Every fd but the returned one is closed, also on error."""
    if UNCHECKED_FOR_TESTS and not create:
        return os.open(os.path.join(root, *parts), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fd = os.open(root, _DIR_FLAGS)
    try:
        for depth, part in enumerate(parts):
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                    if made is not None:
                        made.append(tuple(parts[: depth + 1]))
                except FileExistsError:
                    pass
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd
