"""A ``.gitignore`` file's lines, matched as git matches them, in time linear in the path.

The lines are untrusted (a workspace's own file). Compiled the usual way, a line such as
``**/a*a*a*a*a*a*a*a*a*a*a*a*a*b`` backtracks exponentially against a name of forty
``a``: every ``glob`` and ``list_directory`` below such a file ran to its time limit.
Each line is translated to the glob syntax of ``globmatch`` instead, whose ``*`` takes
the earliest place the rest of its segment fits, atomically (see ``compile_glob``).

Git's rules, as they apply here: blank lines and ``#`` comments are skipped; trailing
spaces are dropped unless escaped; ``!`` negates (``\\!`` and ``\\#`` are literal); a
trailing ``/`` matches directories only; a ``/`` at the start or in the middle anchors
the line to the file's directory, else it matches at any depth; a line that matches a
directory matches everything below it; the last matching line decides.
"""

from __future__ import annotations

import re

from ..globmatch import GlobTooComplex, braces_literal, compile_glob, has_unclosed_class


class _Rule:
    __slots__ = ("container", "dir_only", "negated", "regex")

    def __init__(
        self, regex: re.Pattern[str], container: re.Pattern[str] | None, *, negated: bool, dir_only: bool
    ) -> None:
        self.regex, self.container, self.negated, self.dir_only = regex, container, negated, dir_only

    def names(self, rel: str, *, is_dir: bool) -> bool:
        """Whether this line names ``rel`` itself."""
        if is_dir and self.container is not None and self.container.match(rel):
            return True
        return (is_dir or not self.dir_only) and self.regex.match(rel) is not None


class GitIgnore:
    def __init__(self, lines: list[str]) -> None:
        self.rules = [rule for line in lines if (rule := _rule(line)) is not None]
        self._directories: dict[str, bool | None] = {}  # what the lines say of each, once

    def decides(self, rel: str, *, is_dir: bool) -> bool | None:
        """Whether ``rel`` (relative to the file's directory) is ignored (True),
        re-included (False), or named by no line (None). A path in an ignored directory
        is ignored whatever names it, as in git; else the last line that names it
        decides, and where none does, a directory it lies in that ``!`` re-included
        re-includes it."""
        said = [self._last_naming(directory, is_dir=True) for directory in _ancestors(rel)]
        if True in said:
            return True
        own = self._last_naming(rel, is_dir=is_dir)
        if own is not None:
            return own
        return False if False in said else None

    def _last_naming(self, rel: str, *, is_dir: bool) -> bool | None:
        if is_dir:  # (a walk asks of a directory again for each entry below it)
            if rel not in self._directories:
                self._directories[rel] = self._decided_by_lines(rel, is_dir=True)
            return self._directories[rel]
        return self._decided_by_lines(rel, is_dir=False)

    def _decided_by_lines(self, rel: str, *, is_dir: bool) -> bool | None:
        for rule in reversed(self.rules):
            if rule.names(rel, is_dir=is_dir):
                return not rule.negated
        return None


def _ancestors(rel: str) -> list[str]:
    """``a`` and ``a/b`` for ``a/b/c``."""
    found = []
    at = rel.find("/")
    while at > 0:
        found.append(rel[:at])
        at = rel.find("/", at + 1)
    return found


def _rule(line: str) -> _Rule | None:
    line = _without_trailing_spaces(line.rstrip("\r\n"))
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated or line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/") and not line.endswith("\\/")
    line = line[:-1] if dir_only else line
    if not line.strip("/") or "//" in line or has_unclosed_class(line):
        return None  # (git matches nothing with an empty name between slashes, or a lone "[")
    anchored = "/" in line
    glob = braces_literal(line[1:] if line.startswith("/") else line if anchored else "**/" + line)
    try:
        regex = compile_glob(glob)
        # "dir/**" names what is in dir, and dir itself is then left out with it; so does
        # "dir/***" (any run of stars after the last slash), as git check-ignore says
        trailing = _TRAILING_STARS.search(glob)
        container = compile_glob(glob[: trailing.start()]) if trailing else None
    except GlobTooComplex:  # (braces are escaped: only a very long line gets here)
        return None
    return _Rule(regex, container, negated=negated, dir_only=dir_only)


#: A last component of two or more unescaped stars ("dir/**", "dir/***").
_TRAILING_STARS = re.compile(r"(?<!\\)/\*{2,}$")


def _without_trailing_spaces(line: str) -> str:
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        return stripped + " "  # an escaped space is kept (its backslash escapes it)
    return stripped
