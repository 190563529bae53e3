"""The diffs the write tools show (write_file, edit_file, apply_patch, previews): applied
to the file as it was, each gives the file as it is; and a large file's diff costs time
in the region that changed, never minutes (difflib is quadratic in lines that recur)."""

from __future__ import annotations

import random
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.tools._text import DIFF_MAX_LINES, unified_diff

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def applied(before: str, diff: str) -> str:
    """``diff`` (unified, as the tools write it) applied to ``before``."""
    lines = before.splitlines(keepends=True)
    out: list[str] = []
    taken = 0  # lines of ``before`` consumed
    rows = diff.splitlines(keepends=True)[2:]
    i = 0
    while i < len(rows):
        match = HUNK.match(rows[i])
        assert match, rows[i]
        start, length = int(match[1]), int(match[2] or 1)
        first = start - 1 if length else start  # an empty range names the line before it
        out += lines[taken:first]
        taken = first
        i += 1
        while i < len(rows) and not rows[i].startswith("@@"):
            row = rows[i]
            if i + 1 < len(rows) and rows[i + 1].startswith("\\ No newline"):
                row = row[:-1]  # the tools mark a last line without its newline so
                i += 1
            if row[0] in " -":
                assert lines[taken] == row[1:], (lines[taken], row)
                taken += 1
            if row[0] in " +":
                out.append(row[1:])
            i += 1
    return "".join(out + lines[taken:])


LINES = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "d\n", "}\n", "\n", "x"]), max_size=40).map("".join)


@settings(max_examples=400)
@given(before=LINES, after=LINES, padding=st.integers(0, 12))
def test_a_diff_applied_to_the_file_as_it_was_gives_the_file_as_it_is(before: str, after: str, padding: int) -> None:
    same = "".join(f"same {n}\n" for n in range(padding))  # lines both begin and end with
    old, new = same + before.rstrip("x") + same, same + after.rstrip("x") + same
    diff = unified_diff(old, new, "f.txt")
    assert (diff == "") == (old == new)
    if diff:
        assert applied(old, diff) == new


def test_an_edit_of_a_large_file_compares_only_what_changed() -> None:
    rng = random.Random(7)
    lines = [f"l{rng.randrange(400)}\n" for _ in range(200_000)]  # recurring lines: difflib's worst
    edited = [*lines[:100_000], "inserted\n", *lines[100_000:]]
    started = time.perf_counter()
    diff = unified_diff("".join(lines), "".join(edited), "big.txt")
    assert time.perf_counter() - started < 2.0
    assert "@@ -99998,6 +99998,7 @@" in diff and "+inserted\n" in diff
    assert applied("".join(lines), diff) == "".join(edited)


def test_a_region_too_large_to_compare_is_summarised_at_once() -> None:
    rng = random.Random(8)
    before = "".join(f"l{rng.randrange(300)}\n" for _ in range(40_000))
    after = "".join(f"l{rng.randrange(300)}\n" for _ in range(30_000))
    started = time.perf_counter()
    diff = unified_diff(before, after, "data.csv")
    assert time.perf_counter() - started < 1.0  # difflib itself: about 2 s at 32,000 lines, minutes at 500,000
    assert "too many to compare line by line" in diff and DIFF_MAX_LINES < 30_000
