"""Truncation and sanitization."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from toold_daemon.output import count_lines, sanitize_for_terminal, truncate

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=3000)
limits = st.integers(min_value=0, max_value=4000)


@given(texts, limits)
def test_byte_limit_is_never_exceeded_marker_included(text: str, limit: int) -> None:
    cut = truncate(text, max_bytes=limit)
    assert len(cut.text.encode("utf-8", "surrogatepass")) <= limit
    if len(text.encode("utf-8", "surrogatepass")) <= limit:
        assert cut.text == text and not cut.truncated
    else:
        assert cut.truncated


@given(texts, limits)
def test_char_limit_is_never_exceeded(text: str, limit: int) -> None:
    assert len(truncate(text, max_chars=limit).text) <= limit


@given(st.lists(st.text(alphabet="ab é", max_size=20), max_size=200), st.integers(min_value=1, max_value=50))
@example(["", "a"], 1)  # nothing shown: the text's first newline must not become a line above the marker
def test_line_limit_and_omitted_count(lines: list[str], max_lines: int) -> None:
    text = "\n".join(lines)
    cut = truncate(text, max_lines=max_lines)
    assert count_lines(cut.text) <= max_lines
    if cut.truncated:
        match = re.search(r"\[output truncated: (\d+) bytes, (\d+) lines omitted\]$", cut.text)
        assert match is not None
        kept = cut.text[: match.start()].rstrip("\n")
        assert text.startswith(kept)
        assert int(match.group(1)) == len(text.encode()) - len(cut.text[: match.start()].encode().rstrip(b"\n")) or int(
            match.group(1)
        ) == len(text.encode()) - len(cut.text[: match.start()].encode())


@given(texts, st.integers(min_value=60, max_value=4000))
def test_truncated_text_keeps_a_prefix_and_counts_what_was_omitted(text: str, limit: int) -> None:
    cut = truncate(text, max_bytes=limit)
    if not cut.truncated:
        return
    marker = re.search(r"\[output truncated: (\d+) bytes, (\d+) lines omitted\]$", cut.text)
    assert marker is not None
    body = cut.text[: marker.start()]
    if body.endswith("\n") and not text.startswith(body):
        body = body[:-1]
    assert text.startswith(body)
    assert int(marker.group(1)) == len(text.encode("utf-8", "surrogatepass")) - len(
        body.encode("utf-8", "surrogatepass")
    )


def test_multibyte_characters_are_not_split() -> None:
    cut = truncate("é" * 1000, max_bytes=101)
    cut.text.encode("utf-8")  # would raise on a split surrogate/char
    assert cut.truncated and cut.text.startswith("éé")


def test_limit_smaller_than_marker_gives_cut_marker() -> None:
    assert truncate("x" * 100, max_bytes=5).text == "[outp"


def test_sanitizer_strips_escape_sequences_and_controls() -> None:
    raw = "a\x1b[31mred\x1b[0m \x1b]0;evil title\x07 b\x1bP q\x1b\\ c\u202ed\x00e\x9b2J\tok\r\n"
    clean = sanitize_for_terminal(raw)
    assert "\x1b" not in clean and "\x07" not in clean and "\x9b" not in clean and "\u202e" not in clean
    assert "red" in clean and "\tok\n" in clean and "evil title" not in clean  # CRLF: one newline
    assert "\x00" not in clean


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs")), max_size=200))
def test_sanitizer_keeps_printable_text(text: str) -> None:
    assert sanitize_for_terminal(text) == text


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_ascii_text_is_sanitized_like_any_other(text: str) -> None:
    """The ASCII fast path passes exactly the text without controls (tab and newline aside)."""
    clean = sanitize_for_terminal(text)
    if not re.search("[\x00-\x08\x0b-\x1f\x7f]", text):
        assert clean == text
    else:
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", clean)  # CR too: CRLF is LF, a lone CR is U+FFFD


@given(st.text(max_size=300))
def test_sanitized_text_has_no_control_characters(text: str) -> None:
    clean = sanitize_for_terminal(text)
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", clean)


def test_a_cut_just_before_a_newline_shows_it_as_the_texts_own() -> None:
    """Where the cut lands just before one of the text's newlines, the line break above
    the marker is that newline, shown, not omitted: the count is what is really missing,
    at every limit."""
    text = "\n".join(f"{i}:" + "x" * 60 for i in range(12))
    for limit in range(80, len(text)):
        for cut in (truncate(text, max_bytes=limit), truncate(text, max_chars=limit)):
            marker = re.search(r"\[output truncated: (\d+) bytes, (\d+) lines omitted\]$", cut.text)
            assert marker is not None
            shown = cut.text[: marker.start()]
            if not text.startswith(shown):
                shown = shown[:-1]  # the marker's own line break
            assert text.startswith(shown), limit
            assert int(marker.group(1)) == len(text) - len(shown), limit
            assert int(marker.group(2)) == count_lines(text) - count_lines(shown), limit
