"""Glob patterns as tools and people write them, compiled to regular expressions.

Syntax: ``*`` (anything but ``/``), ``?`` (one character but ``/``), ``[abc]``/``[!a-z]``
classes, ``{a,b}`` alternatives (nestable), and ``**`` as a whole segment for any number
of directories (zero included: ``**/*.py`` matches ``a.py``). A pattern matches the
whole ``/``-separated path. Braces expand first (``{**,x}/a`` is ``**/a`` or ``x/a``),
and matching takes time linear in the path whatever the pattern (``compile_glob``):
patterns come from the model too (the glob tool's, grep's ``file_pattern``).
"""

from __future__ import annotations

import functools
import re

#: The most alternatives a pattern's braces may expand to (``{a,b}{c,d}`` is four), and
#: the most characters they may have together: a 1 KB pattern expanding to 256 long ones
#: took a second to compile.
MAX_ALTERNATIVES = 256
MAX_EXPANDED_CHARS = 16_384


class GlobTooComplex(ValueError):
    """A pattern whose braces expand past ``MAX_ALTERNATIVES`` or ``MAX_EXPANDED_CHARS``."""


@functools.lru_cache(maxsize=512)
def compile_glob(pattern: str, *, case_sensitive: bool = True) -> re.Pattern[str]:
    """The regular expression for ``pattern``, in time linear in the pattern's size for
    any path: its braces are expanded first, and a ``*`` (or ``**/``) with more of the
    pattern after it up to the next one takes the earliest place where that part fits,
    without coming back to try later ones (an atomic group). That is the place any
    match may use, since the next ``*`` absorbs whatever lies between; trying all of
    them instead took exponential time (``*a*a*a*a*a*a*a*a*b`` against 40 ``a``: 3 s;
    with a few more, hours)."""
    flags = 0 if case_sensitive else re.IGNORECASE
    return re.compile(glob_regex(pattern), flags | re.DOTALL)


@functools.lru_cache(maxsize=512)
def glob_regex(pattern: str) -> str:
    """The source of ``compile_glob``'s regular expression (to be compiled with
    ``re.DOTALL``), for one regex over several patterns: compiling each on its own
    first would double the cost (Python's regex compiler takes ~50 µs a pattern). It
    holds no capturing group, so groups put around it tell which pattern matched."""
    alternatives = [_translate(alternative) for alternative in expand_braces(pattern)]
    body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    return body + r"\Z"


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


def expand_braces(pattern: str) -> list[str]:
    """``pattern`` without braces: one pattern per alternative (``a.{py,pyi}`` gives
    ``a.py`` and ``a.pyi``; nestable; an unclosed brace is closed at the end; a brace or
    comma escaped, or inside a ``[...]`` class, is a character). GlobTooComplex past
    ``MAX_ALTERNATIVES`` or ``MAX_EXPANDED_CHARS``: cheap, so a planner may call it."""
    expanded, _ = _expand(pattern, 0, inside=False)
    return expanded


def _expand(pattern: str, i: int, *, inside: bool) -> tuple[list[str], int]:
    """The alternatives of the sequence at ``i``, and where it ends (at a ``,`` or ``}``
    of the enclosing brace when ``inside``, else at the end)."""
    results = [""]
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if inside and ch in ",}":
            return results, i
        if ch == "{":
            pieces: list[str] = []
            i += 1
            while True:
                alternative, i = _expand(pattern, i, inside=True)
                pieces += alternative
                if i < n and pattern[i] == ",":
                    i += 1
                    continue
                i += 1  # past the "}" (or the end: an unclosed brace closes there)
                break
        elif ch == "\\" and i + 1 < n:
            pieces, i = [pattern[i : i + 2]], i + 2
        elif ch == "[" and (end := _class_end(pattern, i)) >= 0:
            pieces, i = [pattern[i : end + 1]], end + 1
        else:
            pieces, i = [ch], i + 1
        results = [start + piece for start in results for piece in pieces]
        if len(results) > MAX_ALTERNATIVES:
            raise GlobTooComplex(f"pattern has more than {MAX_ALTERNATIVES} alternatives: {pattern[:100]}")
        if sum(map(len, results)) > MAX_EXPANDED_CHARS:
            raise GlobTooComplex(f"pattern's alternatives are over {MAX_EXPANDED_CHARS} characters: {pattern[:100]}")
    return results, i


_STAR = "*"  # a token: any run of characters but "/" (the other tokens are fixed-width regexes)
_GLOBSTAR = ["**"]  # a whole segment "**": any number of directories


def _translate(pattern: str) -> str:
    """The regular expression for a pattern without braces. Each segment's regex is
    followed by ``/`` (but the last); a ``**`` segment is ``(?:[^/]*/)*`` (``.*`` at the
    end). The segments between two ``**`` are matched where they first fit, atomically."""
    segments = _segments(pattern)
    last = len(segments) - 1
    out: list[str] = []
    j = 0
    while j <= last:
        segment = segments[j]
        if segment is not _GLOBSTAR:
            out.append(_segment_regex(segment) + ("/" if j < last else ""))
            j += 1
            continue
        if j == last:
            out.append(".*")  # trailing ** : everything below
            break
        following = next((g for g in range(j + 1, last + 1) if segments[g] is _GLOBSTAR), None)
        if following is None or following == j + 1:
            out.append("(?:[^/]*/)*")  # **/ : zero or more directories
            j += 1
            continue
        between = "".join(_segment_regex(s) + "/" for s in segments[j + 1 : following])
        out.append(f"(?>(?:[^/]*/)*?{between})")
        j = following
    return "".join(out)


def _segments(pattern: str) -> list[list[str]]:
    """The pattern's ``/``-separated segments, each a list of tokens (``_STAR`` or a
    fixed-width regex); a segment that is exactly ``**`` is ``_GLOBSTAR``."""
    segments: list[list[str]] = []
    tokens: list[str] = []
    i, n = 0, len(pattern)
    while i <= n:
        escaped_slash = pattern.startswith("\\/", i)  # a slash however written separates
        if i == n or pattern[i] == "/" or escaped_slash:
            segments.append(_GLOBSTAR if not escaped_slash and _is_globstar(pattern, i) else tokens)
            tokens = []
            i += 2 if escaped_slash else 1
            continue
        ch = pattern[i]
        if ch == "*":
            while i < n and pattern[i] == "*":
                i += 1
            if not tokens or tokens[-1] is not _STAR:
                tokens.append(_STAR)
            continue
        if ch == "?":
            tokens.append("[^/]")
        elif ch == "[" and (end := _class_end(pattern, i)) >= 0:
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            # (a "]" first in the class is one of its characters: escaped, as "[" is)
            body = body.replace("\\", "\\\\").replace("/", "").replace("]", "\\]").replace("[", "\\[")
            tokens.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end
        elif ch == "\\" and i + 1 < n:
            i += 1
            tokens.append(re.escape(pattern[i]))
        else:
            tokens.append(re.escape(ch))
        i += 1
    return segments


def _is_globstar(pattern: str, end: int) -> bool:
    """Whether the segment ending at ``end`` is exactly ``**`` (not ``***``, not ``a**``)."""
    start = pattern.rfind("/", 0, end) + 1
    return pattern[start:end] == "**"


def _segment_regex(tokens: list[str]) -> str:
    """A segment's regex: with two or more ``*``, each part between two of them is
    matched where it first fits, atomically (see ``compile_glob``)."""
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token is _STAR:
            parts.append([])
        else:
            parts[-1].append(token)
    fixed = ["".join(part) for part in parts]
    if len(fixed) <= 2:  # at most one star: no choice to come back to but its length
        return "[^/]*".join(fixed)
    head, *middle, tail = fixed
    return head + "".join(f"(?>[^/]*?{part})" for part in middle) + "[^/]*" + tail


def braces_literal(pattern: str) -> str:
    """``pattern`` with its braces and commas taken as themselves (for syntaxes that have
    no braces, such as ``.gitignore``): escaped, but inside a ``[...]`` class, where an
    escape would add a backslash to the class."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[" and (end := _class_end(pattern, i)) >= 0:
            out.append(pattern[i : end + 1])
            i = end + 1
            continue
        out.append("\\" + ch if ch in "{}," else ch)
        i += 1
    return "".join(out)


def has_unclosed_class(pattern: str) -> bool:
    """Whether an unescaped ``[`` in ``pattern`` opens no class (git's matching then
    matches nothing; ours would take the ``[`` as itself)."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "[":
            end = _class_end(pattern, i)
            if end < 0:
                return True
            i = end
        i += 1
    return False


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
