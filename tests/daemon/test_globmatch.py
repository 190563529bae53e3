"""The glob matcher against a small independent reference implementation."""

from __future__ import annotations

import fnmatch
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.globmatch import (
    MAX_ALTERNATIVES,
    GlobTooComplex,
    compile_glob,
    expand_braces,
    literal_prefix,
    matches,
)
from toold_daemon.sandbox.paths import FirstMatch


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


segment = st.sampled_from(["a", "b", "ab", "a.py", "b.txt", "x.py", ".h", "abab", "aab.py", "baa"])
pattern_segment = st.sampled_from(
    ["a", "*", "*.py", "a*", "?", "**", "b.txt", "[ab]", "[!a]*", "*a*", "*a*b", "a*b*", "*a*a*", "*[ab]*b*", "?*a*"]
)


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


@pytest.mark.parametrize(
    ("pattern", "miss", "hit"),
    [
        # 3 s at 8 stars and 40 a's before; hours at 20
        ("*a" * 20 + "*b", "a" * 200, "a" * 199 + "b"),
        ("**/a/" * 12 + "**/b", "a/" * 100 + "x", "a/" * 100 + "b"),
        ("**/*a*a*a*a*a*/**/*b*b*b*/**/c", "/".join(["a" * 16] * 60), "/".join(["a" * 16] * 60) + "/bbb/c"),
        ("{*a,*aa}" * 4 + "b", "a" * 100, "a" * 99 + "b"),
    ],
    ids=["stars in a name", "globstars", "both", "braces"],
)
def test_no_pattern_takes_more_than_linear_time(pattern: str, miss: str, hit: str) -> None:
    """A model's glob (the glob tool's pattern, grep's file_pattern) cannot make a worker
    spin: a part between two stars is matched where it first fits, never tried again."""
    regex = compile_glob(pattern)
    started = time.perf_counter()
    assert regex.match(miss) is None and regex.match(hit) is not None
    assert time.perf_counter() - started < 0.5


def test_braces_expand_first() -> None:
    assert expand_braces("a.{py,pyi}") == ["a.py", "a.pyi"]
    assert expand_braces("{a,{b,c}d}") == ["a", "bd", "cd"]
    assert expand_braces("{a,b") == ["a", "b"]  # an unclosed brace closes at the end
    assert expand_braces("[{]x,\\{y\\}") == ["[{]x,\\{y\\}"]  # in a class, escaped, or a lone comma: characters
    assert matches("{**,x}/a.py", "d/e/a.py")  # ** in an alternative is ** once expanded
    with pytest.raises(GlobTooComplex):
        compile_glob("{a,b}" * 9)  # 512 alternatives
    assert len(expand_braces("{a,b}" * 8)) == MAX_ALTERNATIVES


@given(
    st.lists(st.lists(pattern_segment, min_size=1, max_size=3).map("/".join), min_size=1, max_size=6, unique=True),
    st.lists(segment, min_size=1, max_size=4).map("/".join),
)
def test_one_regex_over_many_patterns_names_the_first_that_matches(patterns: list[str], path: str) -> None:
    """The sandbox matches its denied and protected patterns in one pass: the pattern it
    names must be the first in order that matches on its own, or none when none does."""
    first = FirstMatch.of(tuple(patterns), tuple(patterns)).first(path)
    assert first == next((p for p in patterns if matches(p, path)), None), (patterns, path)


def test_one_regex_over_many_patterns_with_braces_and_case() -> None:
    patterns = ("**/*.{pem,key}", "/srv/x/**", "**/.ENV", "secrets/**")
    first = FirstMatch.of(patterns, patterns).first
    assert first("a/b/server.key") == "**/*.{pem,key}"
    assert first("a/.env") == "**/.ENV"  # compiled casefolded: subjects are casefolded by the caller
    assert first("secrets/.env") == "**/.ENV"  # both match: the first written wins
    assert first("secrets/a.txt") == "secrets/**"
    assert first("a/b.txt") is None
    assert FirstMatch.of((), ()).first("a") is None
