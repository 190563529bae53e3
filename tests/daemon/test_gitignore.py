"""``.gitignore`` lines matched as git matches them, in time linear in the path: one line
at a time as pathspec matches it (others' implementation, on drawn lines and paths),
several lines as git itself answered (``git check-ignore``, recorded below), and a line
built to backtrack in no time at all."""

from __future__ import annotations

import re
import time

import pathspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.tools._gitignore import GitIgnore

PIECES = ["a", "b", "ab", "*", "**", "/", "?", "[ab]", "[", "]", ",", "{", "!", "\\*", "\\!", "#", " ", "\\ "]
LINES = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)
PATHS = st.lists(st.sampled_from(["a", "b", "ab", "ba", "x", "a b", "*", "!a"]), min_size=1, max_size=4).map("/".join)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # (pathspec's own regexes: "possible nested set")
@settings(max_examples=2000, deadline=None)
@given(LINES, PATHS, st.booleans())
def test_one_line_names_what_pathspec_says_it_names(line: str, path: str, is_dir: bool) -> None:
    if not line.strip("!/ "):
        return  # nothing but slashes: pathspec reads it as "everything", git as nothing
    if "[!" in line or "[^" in line:
        return  # a negated class: pathspec lets it match the "/" it appends to a directory
    if re.search(r"/\*{3,}/$", line):
        return  # "d/***/": pathspec leaves out the directory that "d/**/" names; git does not (AS_GIT_SAYS)
    try:
        spec = pathspec.GitIgnoreSpec.from_lines([line])
    except ValueError:  # a line pathspec refuses (a lone escape at its end)
        return
    theirs = spec.check_file(path + "/" if is_dir else path).include
    assert GitIgnore([line]).decides(path, is_dir=is_dir) == theirs, (line, path, is_dir)


#: (lines, path, is a directory, git check-ignore's answer: ignored, re-included, neither)
AS_GIT_SAYS = [
    (["*.log", "!keep.log"], "x.log", False, True),
    (["*.log", "!keep.log"], "keep.log", False, False),
    (["*.log", "!keep.log"], "d/keep.log", False, False),
    (["*.log", "!keep.log"], "d/x.log", False, True),
    (["build/"], "build", True, True),
    (["build/"], "build", False, None),
    (["build/"], "a/build", True, True),
    (["/root.txt"], "root.txt", False, True),
    (["/root.txt"], "a/root.txt", False, None),
    (["doc/*.txt"], "doc/a.txt", False, True),
    (["doc/*.txt"], "doc/sub/a.txt", False, None),
    (["a/**/b"], "a/b", False, True),
    (["a/**/b"], "a/x/y/b", False, True),
    (["a/**/b"], "b", False, None),
    (["\\!important", "\\#x", "#y"], "!important", False, True),
    (["\\!important", "\\#x", "#y"], "#x", False, True),
    (["\\!important", "\\#x", "#y"], "#y", False, None),
    (["trail\\ "], "trail ", False, True),
    (["trail\\ "], "trail", False, None),
    (["{a,b}"], "{a,b}", False, True),
    (["{a,b}"], "a", False, None),
    (["d/**"], "d", True, True),
    (["d/**"], "d/x", False, True),
    (["d/***"], "d", True, True),  # (any run of stars after the last slash, as git says)
    (["d/***/"], "d", True, True),  # (so with a slash after them too)
    (["d/***/"], "d", False, None),
    (["d/***"], "d/x/y", False, True),
    (["**", "!a"], "ba/a", False, True),  # in an ignored directory: no line re-includes it
    (["?", "!b"], "b/a", False, True),
    (["!*", "?"], "x/x/x", True, True),
    (["a[!a]"], "a", True, None),
    (["a[!a]"], "ab", False, True),
    (["["], "[", False, None),  # a class never closed matches nothing
    (["a[b"], "a[b", False, None),
    (["[]]"], "]", False, True),  # "]" first is one of the class's characters
    (["[!]]x"], "ax", False, True),
    (["[!]]x"], "]x", False, None),
    (["x[a,b]"], "x,", False, True),  # no braces in git, and a comma in a class is itself
    (["x[a,b]"], "x\\", False, None),
]


@pytest.mark.parametrize(("lines", "path", "is_dir", "git"), AS_GIT_SAYS)
def test_lines_name_what_git_says_they_name(lines: list[str], path: str, is_dir: bool, git: bool | None) -> None:
    assert GitIgnore(lines).decides(path, is_dir=is_dir) is git


def test_a_line_built_to_backtrack_decides_at_once() -> None:
    """Compiled the usual way, this line against forty ``a`` takes longer than any
    call may run (minutes, then hours with a few more ``a*``)."""
    ignore = GitIgnore(["**/a*a*a*a*a*a*a*a*a*a*a*a*a*b", "/**/x/**/x/**/x/**/x/**/x/**/x/**/y"])
    started = time.perf_counter()
    assert ignore.decides("a" * 200, is_dir=False) is None
    assert ignore.decides("/".join(["x"] * 400) + "/z", is_dir=False) is None
    assert ignore.decides("a" * 20 + "b", is_dir=False) is True
    assert time.perf_counter() - started < 0.5
