"""Guarding regular expressions from clients and configs against catastrophic backtracking.

Python's ``re`` can take exponential time on a repeated group that itself contains a
repetition (``(a+)+``, ``(\\w*x)*``), and it holds the GIL meanwhile, so one such
pattern would stall every client of the daemon. Patterns of that shape, and very
long ones, are refused. (Overlapping alternation such as ``(a|aa)+`` is not caught.)
"""

from __future__ import annotations

import re

MAX_PATTERN_CHARS = 1024
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)\s*[+*{]")


def risky(pattern: str) -> str | None:
    """Why ``pattern`` is refused, or None if it may be used."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"pattern is longer than {MAX_PATTERN_CHARS} characters"
    if _NESTED_QUANTIFIER.search(pattern):
        return "pattern has a repeated group that contains a repetition (like (a+)+), which can take exponential time"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    return None
