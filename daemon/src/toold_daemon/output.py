"""Bounding and sanitizing tool output. Every result passes through here.

``truncate`` keeps the head of a text within a byte, character and line limit and
appends a marker that counts what was omitted; the marker is *inside* the limit. What
the producer dropped before the text reached us (a command's output past what its
supervisor keeps) is counted too (``unseen``), so the marker tells how much the tool
really produced; a count that is not known exactly says "at least".
``sanitize_for_terminal`` (shared with clients, from the protocol package) neutralizes
escape sequences and control characters so output can be shown in a terminal.
"""

from __future__ import annotations

import msgspec

from toold_protocol import sanitize_for_terminal

__all__ = ["Truncation", "Unseen", "count_lines", "sanitize_for_terminal", "truncate"]


class Unseen(msgspec.Struct, frozen=True):
    """Output a tool produced that is not in the text handed to ``truncate``."""

    bytes: int = 0
    lines: int = 0
    exact: bool = True  # False: at least this much (the producer stopped counting)

    def __bool__(self) -> bool:
        return self.bytes > 0 or self.lines > 0 or not self.exact


NOTHING_UNSEEN = Unseen()


class Truncation(msgspec.Struct, frozen=True):
    text: str
    truncated: bool
    omitted_bytes: int = 0
    omitted_lines: int = 0


def _marker(omitted_bytes: int, omitted_lines: int, *, exact: bool = True) -> str:
    at_least = "" if exact else "at least "
    return f"[output truncated: {at_least}{omitted_bytes} bytes, {at_least}{omitted_lines} lines omitted]"


def count_lines(text: str) -> int:
    """Lines as people count them: a final newline does not start another line."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def truncate(
    text: str,
    *,
    max_bytes: int | None = None,
    max_chars: int | None = None,
    max_lines: int | None = None,
    unseen: Unseen = NOTHING_UNSEEN,
    head: str = "",
    tail: str = "",
) -> Truncation:
    """``head + text + tail`` cut to fit every given limit, marker included. Only ``text``
    is cut (``head``, an error line, and ``tail``, an exit-code line, are always kept
    whole when they fit). The cut lands on a character boundary. If a limit is smaller
    than what must be kept, the whole result is cut to the limit.
    """
    encoded = text.encode("utf-8", "surrogatepass")
    total_lines = count_lines(text)
    whole = _join(head, text, tail)
    if not unseen and _fits(whole, max_bytes, max_chars, max_lines):
        return Truncation(whole, False)

    # The marker grows with its numbers; the totals bound them.
    worst = _marker(len(encoded) + unseen.bytes, total_lines + unseen.lines, exact=unseen.exact)
    fixed = _join(head, worst, tail)
    body = text
    if max_lines is not None:
        body = body[: _index_after_lines(body, max(0, max_lines - count_lines(fixed)))]
    if max_chars is not None:
        body = body[: max(0, max_chars - len(fixed) - 1)]
    if max_bytes is not None:
        budget = max(0, max_bytes - len(fixed.encode("utf-8", "surrogatepass")) - 1)
        body_bytes = body.encode("utf-8", "surrogatepass")
        if len(body_bytes) > budget:
            body = body_bytes[:budget].decode("utf-8", "ignore")
    if body and len(body) < len(text) and text[len(body)] == "\n" and not body.endswith("\n"):
        body += "\n"  # the line break above the marker is the text's own: shown, not omitted
    omitted_bytes = len(encoded) - len(body.encode("utf-8", "surrogatepass")) + unseen.bytes
    omitted_lines = total_lines - count_lines(body) + unseen.lines
    result = _join(head, _join(body, _marker(omitted_bytes, omitted_lines, exact=unseen.exact)), tail)
    if not _fits(result, max_bytes, max_chars, max_lines):
        # Only when a limit is smaller than what must be kept.
        limits = [x for x in (max_bytes, max_chars) if x is not None]
        cut = result.encode("utf-8", "surrogatepass")[: min(limits)] if limits else result.encode()
        result = cut.decode("utf-8", "ignore")
        if max_lines is not None:
            result = result[: _index_after_lines(result, max_lines)].rstrip("\n")
    return Truncation(result, True, omitted_bytes, omitted_lines)


def _join(first: str, second: str, third: str = "") -> str:
    """Texts one after another, each starting on a line of its own."""
    out = first
    for part in (second, third):
        if part:
            out += ("" if not out or out.endswith("\n") else "\n") + part
    return out


def _fits(text: str, max_bytes: int | None, max_chars: int | None, max_lines: int | None) -> bool:
    return (
        (max_lines is None or count_lines(text) <= max_lines)
        and (max_chars is None or len(text) <= max_chars)
        and (max_bytes is None or len(text.encode("utf-8", "surrogatepass")) <= max_bytes)
    )


def _index_after_lines(text: str, lines: int) -> int:
    """Index just after the ``lines``-th newline (the whole text if it has fewer)."""
    index = 0
    for _ in range(lines):
        found = text.find("\n", index)
        if found < 0:
            return len(text)
        index = found + 1
    return index
