"""The glob matcher against a small independent reference implementation."""

from __future__ import annotations

import fnmatch

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.globmatch import literal_prefix, matches


def reference(pattern: str, path: str) -> bool:
    """Segment-wise matching: ``**`` spans zero or more segments, others use fnmatch per segment."""
    pat, parts = pattern.split("/"), path.split("/")

    def go(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(parts)
        if pat[i] == "**" and i == len(pat) - 1:
            return j < len(parts)  # a trailing ** means "something below", as in .gitignore
        if pat[i] == "**":
            return any(go(i + 1, k) for k in range(j, len(parts) + 1))
        return j < len(parts) and fnmatch.fnmatchcase(parts[j], pat[i]) and go(i + 1, j + 1)

    return go(0, 0)


segment = st.sampled_from(["a", "b", "ab", "a.py", "b.txt", "x.py", ".h"])
pattern_segment = st.sampled_from(["a", "*", "*.py", "a*", "?", "**", "b.txt", "[ab]", "[!a]*"])


@given(st.lists(pattern_segment, min_size=1, max_size=4), st.lists(segment, min_size=1, max_size=4))
def test_matches_like_the_reference(pattern_parts: list[str], path_parts: list[str]) -> None:
    pattern, path = "/".join(pattern_parts), "/".join(path_parts)
    assert matches(pattern, path) == reference(pattern, path), (pattern, path)


def test_braces_and_examples() -> None:
    assert matches("**/*.{ts,tsx}", "src/a/b.tsx")
    assert matches("**/*.{ts,tsx}", "b.ts")
    assert not matches("**/*.{ts,tsx}", "b.js")
    assert matches("*.py", "a.py") and not matches("*.py", "d/a.py")
    assert matches("src/**", "src/a/b/c")
    assert not matches("src/**", "srcx/a")


def test_literal_prefix() -> None:
    assert literal_prefix("src/a/**/*.py") == "src/a"
    assert literal_prefix("**/*.py") == ""
    assert literal_prefix("*.py") == ""
