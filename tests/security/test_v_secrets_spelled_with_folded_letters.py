"""Credentials are hidden from summaries and audit records however their label is
spelled: the quick screen before the regular expression must never let through a text
the expression would change. The expression matches case-insensitively, and Unicode
case folding takes a few letters for ``s`` and ``i`` (the long s, the dotless i, the
dotted capital I) that ``str.lower`` keeps apart; each is tried in every label."""

from __future__ import annotations

import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.redaction import _SECRET, hide_secrets

LABELS = ["api_key", "apikey", "token", "secret", "password", "passwd", "authorization", "bearer"]


def _folded_alike(letter: str) -> list[str]:
    """Every character the expression's case-insensitive match takes for ``letter``."""
    pattern = re.compile("(?i)" + re.escape(letter))
    return [chr(cp) for cp in range(sys.maxunicode + 1) if pattern.fullmatch(chr(cp))]


ALIKE = {letter: _folded_alike(letter) for letter in set("".join(LABELS)) if letter.isalpha()}


def _respellings(label: str) -> list[str]:
    """``label`` with one letter at a time replaced by each character folded alike."""
    out = []
    for index, letter in enumerate(label):
        for other in ALIKE.get(letter, []):
            out.append(label[:index] + other + label[index + 1 :])
    return out


@pytest.mark.parametrize("label", LABELS)
def test_a_label_spelled_with_any_letter_folded_alike_is_still_hidden(label: str) -> None:
    spellings = _respellings(label)
    assert len(spellings) >= 2 * len(label.replace("_", ""))  # each letter in both cases at least
    for spelled in spellings:
        text = f"curl -H '{spelled}: hunter2xyz' https://example.test" if label != "bearer" else f"{spelled} hunter2xyz"
        assert _SECRET.search(text), spelled  # the expression takes it ...
        hidden = hide_secrets(text)
        assert "hunter2xyz" not in hidden, (spelled, hidden)  # ... and so the screen must


def test_the_letters_str_lower_keeps_apart_are_among_those_tried() -> None:
    assert {"\u017f", "\u0131", "\u0130", "\u212a"} <= {c for cs in ALIKE.values() for c in cs}


@given(st.text(alphabet=st.sampled_from(sorted({c for cs in ALIKE.values() for c in cs} | set("=: _-")))))
def test_the_screen_never_skips_what_the_expression_would_change(text: str) -> None:
    assert hide_secrets(text) == _SECRET.sub(lambda m: m.group(1) + "***", text)
