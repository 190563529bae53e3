"""The child environment rule: empty, allowlist in, secrets and injection hooks out."""

from __future__ import annotations

import fnmatch
import re

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.sandbox.environment import (
    BASE_ALLOWLIST,
    INJECTION_PATTERNS,
    SECRET_PATTERNS,
    NameGlobs,
    child_environment,
    is_dropped,
)

PARENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TERM": "xterm",
    "EDITOR": "vim",
    "RANDOM_APP_SETTING": "x",
    "OPENAI_API_KEY": "sk",
    "LD_PRELOAD": "/evil.so",
}


def test_only_allowlisted_names_pass() -> None:
    env = child_environment(PARENT)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm"}


def test_config_allowlist_cannot_let_a_secret_or_hook_through() -> None:
    env = child_environment(PARENT, allow=["RANDOM_APP_SETTING", "OPENAI_API_KEY", "LD_*"])
    assert env["RANDOM_APP_SETTING"] == "x"
    assert "OPENAI_API_KEY" not in env and "LD_PRELOAD" not in env


def test_config_denylist_and_set_vars() -> None:
    env = child_environment(PARENT, deny=["TERM"], set_vars={"TMPDIR": "/tmp/x", "BASH_ENV": "/evil"})
    assert "TERM" not in env and env["TMPDIR"] == "/tmp/x" and "BASH_ENV" not in env


def test_a_missing_path_gets_a_default() -> None:
    assert child_environment({})["PATH"].startswith("/usr/local/sbin")


SECRETISH = st.sampled_from(
    ["API_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "AWS_", "ANTHROPIC_", "OPENAI_", "GITHUB_TOKEN", "DATABASE_URL"]
)


@given(prefix=st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,8}", fullmatch=True), secret=SECRETISH, lower=st.booleans())
def test_secret_shaped_names_are_dropped_in_any_case(prefix: str, secret: str, lower: bool) -> None:
    name = f"{prefix}_{secret}" if not secret.endswith("_") else f"{secret}{prefix}"
    name = name.lower() if lower else name
    assert is_dropped(name), name
    assert name not in child_environment({name: "v"}, allow=[name])


#: Pattern pieces that make every shape: the four that string methods answer, and those
#: that need a regex (``?``, ``[...]``, a ``*`` inside).
PATTERN_PIECES = st.sampled_from(["*", "**", "?", "[AB]", "[!A]", "A", "b", "_", "K", "\u212a", "ß", "ſ", "]"])
NAME_LETTERS = st.sampled_from(["A", "a", "B", "b", "_", "K", "k", "\u212a", "ß", "SS", "S", "ſ", "\n", "["])


@given(
    patterns=st.lists(st.lists(PATTERN_PIECES, max_size=5).map("".join), max_size=6),
    name=st.lists(NAME_LETTERS, max_size=6).map("".join),
)
def test_name_globs_answer_as_fnmatch_does(patterns: list[str], name: str) -> None:
    """Every shape of pattern, on any name: the same answer as the pattern's ``fnmatch``
    regex over the upper-cased name, which is what the lists meant before they were
    answered with string methods."""
    expected = any(re.match(fnmatch.translate(p.upper()), name.upper()) for p in patterns)
    assert NameGlobs(patterns).match(name) is expected


def test_name_globs_of_the_built_in_lists_need_no_regex() -> None:
    """The built-in lists are all of the four plain shapes: nothing to compile at start."""
    built_in = NameGlobs((*BASE_ALLOWLIST, *SECRET_PATTERNS, *INJECTION_PATTERNS))
    assert built_in._others is None
    assert built_in.match("GITHUB_TOKEN") and built_in.match("my_db_password_2") and built_in.match("LD_PRELOAD")
    assert not built_in.match("RANDOM_APP_SETTING")
