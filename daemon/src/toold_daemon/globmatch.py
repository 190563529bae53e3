"""Glob patterns as tools and people write them, compiled to regular expressions.

Syntax: ``*`` (anything but ``/``), ``?`` (one character but ``/``), ``[abc]``/``[!a-z]``
classes, ``{a,b}`` alternatives (nestable), and ``**`` as a whole segment for any number
of directories (zero included: ``**/*.py`` matches ``a.py``). A pattern matches the
whole ``/``-separated path.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=512)
def compile_glob(pattern: str, *, case_sensitive: bool = True) -> re.Pattern[str]:
    flags = 0 if case_sensitive else re.IGNORECASE
    return re.compile(_translate(pattern) + r"\Z", flags | re.DOTALL)


def matches(pattern: str, path: str) -> bool:
    return compile_glob(pattern).match(path) is not None


def last_name_glob(pattern: str) -> str | None:
    """A glob for the last name of any path ``pattern`` matches, or of its directory when
    it ends in ``/**`` (``*.pem`` for ``**/*.pem``, ``.ssh`` for ``**/.ssh/**``); None when
    no such glob can be told (a ``**`` or a ``{a/b}`` in the last name). A path whose last
    name does not match it is certain not to match ``pattern``: a cheap check first."""
    while pattern.endswith("/**"):
        pattern = pattern[: -len("/**")]
    if "{" in pattern and "/" in pattern[pattern.find("{") :]:
        return None  # an alternative may hold a separator: the last name is not plain text
    name = pattern.rsplit("/", 1)[-1]
    if not name or "**" in name:
        return None
    return name


def literal_prefix(pattern: str) -> str:
    """The leading directories of ``pattern`` that contain no glob syntax (``src/a`` for ``src/a/**/*.py``)."""
    segments = pattern.split("/")
    prefix: list[str] = []
    for segment in segments[:-1]:
        if any(ch in segment for ch in "*?[{\\"):
            break
        prefix.append(segment)
    return "/".join(prefix)


def _translate(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    depth = 0  # inside {...}
    while i < n:
        ch = pattern[i]
        at_segment_start = i == 0 or pattern[i - 1] == "/"
        if ch == "*" and pattern.startswith("**", i) and at_segment_start and (i + 2 == n or pattern[i + 2] == "/"):
            if i + 2 == n:
                out.append(".*")  # trailing ** : everything below
                i += 2
            else:
                out.append("(?:[^/]*/)*")  # **/ : zero or more directories
                i += 3
            continue
        if ch == "*":
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = _class_end(pattern, i)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : end]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\").replace("/", "")
                out.append(f"[^/{body}]" if negate else f"[{body}]")
                i = end
        elif ch == "{":
            depth += 1
            out.append("(?:")
        elif ch == "}" and depth:
            depth -= 1
            out.append(")")
        elif ch == "," and depth:
            out.append("|")
        elif ch == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    out.extend(")" * depth)  # an unclosed brace is closed at the end
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if i < len(pattern) and pattern[i] in "!^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "]":
            return i
        if pattern[i] == "/":
            return -1
        i += 1
    return -1
