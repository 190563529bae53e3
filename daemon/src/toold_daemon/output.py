"""Bounding and sanitizing tool output. Every result passes through here.

``truncate`` keeps the head of a text within a byte, character and line limit and
appends a marker that counts what was omitted; the marker is *inside* the limit.
``sanitize_for_terminal`` (shared with clients, from the protocol package) neutralizes
escape sequences and control characters so output can be shown in a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

from toold_protocol import sanitize_for_terminal

__all__ = ["Truncation", "count_lines", "sanitize_for_terminal", "truncate"]


@dataclass(frozen=True, slots=True)
class Truncation:
    text: str
    truncated: bool
    omitted_bytes: int = 0
    omitted_lines: int = 0


def _marker(omitted_bytes: int, omitted_lines: int) -> str:
    return f"[output truncated: {omitted_bytes} bytes, {omitted_lines} lines omitted]"


def count_lines(text: str) -> int:
    """Lines as people count them: a final newline does not start another line."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def truncate(
    text: str, *, max_bytes: int | None = None, max_chars: int | None = None, max_lines: int | None = None
) -> Truncation:
    """Cut ``text`` so that it fits every given limit, marker included.

    The cut lands on a character boundary (never splits UTF-8). If a limit is smaller
    than the marker itself, the marker is cut to the limit.
    """
    encoded = text.encode("utf-8", "surrogatepass")
    total_lines = count_lines(text)
    if (
        (max_bytes is None or len(encoded) <= max_bytes)
        and (max_chars is None or len(text) <= max_chars)
        and (max_lines is None or total_lines <= max_lines)
    ):
        return Truncation(text, False)

    # The marker grows with its numbers; the totals bound them, +1 for a joining newline.
    worst = len(_marker(len(encoded), total_lines)) + 1
    body = text
    if max_lines is not None:
        body = body[: _index_after_lines(body, max(0, max_lines - 1))]
    if max_chars is not None and len(body) > max(0, max_chars - worst):
        body = body[: max(0, max_chars - worst)]
    if max_bytes is not None:
        body_bytes = body.encode("utf-8", "surrogatepass")
        budget = max(0, max_bytes - worst)
        if len(body_bytes) > budget:
            body = body_bytes[:budget].decode("utf-8", "ignore")
    kept_bytes = len(body.encode("utf-8", "surrogatepass"))
    omitted_bytes = len(encoded) - kept_bytes
    omitted_lines = total_lines - count_lines(body)
    joiner = "" if not body or body.endswith("\n") else "\n"
    result = body + joiner + _marker(omitted_bytes, omitted_lines)
    limits = [x for x in (max_bytes, max_chars) if x is not None]
    if limits and len(result.encode("utf-8", "surrogatepass")) > min(limits):
        # Only possible when the limit is smaller than the marker itself.
        result = _marker(len(encoded), total_lines)[: min(limits)]
    return Truncation(result, True, omitted_bytes, omitted_lines)


def _index_after_lines(text: str, lines: int) -> int:
    """Index just after the ``lines``-th newline (the whole text if it has fewer)."""
    index = 0
    for _ in range(lines):
        found = text.find("\n", index)
        if found < 0:
            return len(text)
        index = found + 1
    return index
