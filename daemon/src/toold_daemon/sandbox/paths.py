"""Path validation (seed 003 §3.5 algorithm) and symlink-safe opening.

``Sandbox.resolve`` turns a path written by a model into a canonical absolute path
inside one of the roots, or raises a SandboxViolation. It touches the filesystem
only to canonicalize the deepest existing ancestor.

``Sandbox.open`` then opens that path one component at a time from the root's
directory with ``O_NOFOLLOW``: the canonical path has no symlinks, so a symlink met
there was swapped in after validation, and the open fails with ``ELOOP`` instead of
following it out of the roots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from ..errors import bad_args, from_os_error, sandbox_violation
from ..globmatch import compile_glob

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Sandbox:
    def __init__(
        self,
        roots: Sequence[Path | str],
        *,
        denied_patterns: Iterable[str] = (),
        allow_absolute: bool = False,
    ) -> None:
        if not roots:
            raise ValueError("a sandbox needs at least one root")
        canonical: list[Path] = []
        for root in roots:
            real = Path(os.path.realpath(root))
            if not real.is_dir():
                raise ValueError(f"sandbox root is not a directory: {root}")
            canonical.append(real)
        self.roots: tuple[Path, ...] = tuple(canonical)
        self.working_dir = self.roots[0]
        self.allow_absolute = allow_absolute
        self.denied_patterns: tuple[str, ...] = tuple(dict.fromkeys(denied_patterns))
        self._denied = [(p, compile_glob(p)) for p in self.denied_patterns]
        # One alternation answers the common question "is anything denied?" in one pass.
        self._denied_any = (
            re.compile("|".join(f"(?:{regex.pattern})" for _, regex in self._denied), re.DOTALL)
            if self._denied
            else None
        )

    # ------------------------------------------------------------------ validation

    def resolve(self, raw: str, *, base: Path | None = None) -> Path:
        """Validate ``raw`` and return its canonical absolute path (FR-VAL-04)."""
        if not raw:
            raise bad_args("path must not be empty")
        if "\x00" in raw:
            raise bad_args("path must not contain NUL bytes")
        pure = PurePosixPath(raw)
        if pure.is_absolute() and not self.allow_absolute:
            raise sandbox_violation(
                "ABSOLUTE_PATH",
                f"Absolute paths are not allowed: {raw} (use a path relative to the root)",
                attempted=raw,
            )
        if ".." in pure.parts:
            raise sandbox_violation("PATH_TRAVERSAL", f"Path must not contain '..': {raw}", attempted=raw)
        candidate = os.path.normpath(os.path.join(base or self.working_dir, raw))
        try:
            resolved = Path(os.path.realpath(candidate))
        except OSError as exc:  # the path changed while it was being resolved (a racing rename)
            raise from_os_error(exc, raw) from None
        if self.root_of(resolved) is None:
            raise sandbox_violation(
                "PATH_OUTSIDE_SANDBOX",
                f"Path is outside the sandbox roots: {raw}",
                attempted=raw,
                resolved=str(resolved),
            )
        pattern = self.denied_pattern(resolved)
        if pattern is not None:
            raise sandbox_violation(
                "DENIED_PATTERN",
                f"Access to {raw} is denied by pattern {pattern}",
                attempted=raw,
                pattern=pattern,
            )
        return resolved

    def root_of(self, path: Path) -> Path | None:
        """The root that contains canonical ``path``, compared by components (``/r-evil`` is not in ``/r``)."""
        for root in self.roots:
            if path == root or path.is_relative_to(root):
                return root
        return None

    def denied_pattern(self, path: Path) -> str | None:
        text = path.as_posix()
        if self._denied_any is None or not (self._denied_any.match(text) or self._denied_any.match(text.lstrip("/"))):
            return None
        for pattern, regex in self._denied:
            if regex.match(text) or regex.match(text.lstrip("/")):
                return pattern
        return None

    def display(self, path: Path) -> str:
        """``path`` relative to its root, as shown to the model."""
        root = self.root_of(path)
        if root is None:
            return str(path)
        rel = path.relative_to(root).as_posix()
        if len(self.roots) > 1 and root != self.working_dir:
            return str(path)
        return rel or "."

    # ------------------------------------------------------------------ symlink-safe opening

    def open(self, path: Path, flags: int = os.O_RDONLY, *, display: str | None = None) -> int:
        """Open validated ``path`` beneath its root, refusing symlinks on the way. Returns an fd."""
        shown = display or str(path)
        root = self.root_of(path)
        if root is None:
            raise sandbox_violation("PATH_OUTSIDE_SANDBOX", f"Path is outside the sandbox roots: {shown}")
        parts = path.relative_to(root).parts
        try:
            fd = os.open(root, _DIR_FLAGS)
        except OSError as exc:
            raise from_os_error(exc, shown) from None
        try:
            for part in parts[:-1]:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
            if not parts:
                return fd
            final = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise from_os_error(exc, shown) from None
        os.close(fd)
        return final

    def open_dir(self, path: Path, *, display: str | None = None) -> int:
        return self.open(path, os.O_RDONLY | os.O_DIRECTORY, display=display)
