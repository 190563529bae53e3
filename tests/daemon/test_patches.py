"""LP1 and Begin Patch, pure: worked examples from the spec notes, errors, properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon import patches
from toold_daemon.patches import PatchError
from toold_daemon.tools._text import Text, decode


def run(patch: str, files: dict[str, str]) -> dict[str, str | None]:
    """Apply to in-memory files (raw text with their own line endings); return the results."""

    def load(path: str) -> Text | None:
        return decode(files[path].encode(), path) if path in files else None

    out: dict[str, str | None] = {}
    for change in patches.apply(patch, load):
        out[change.path] = change.after.encode().decode() if change.after is not None else None
        if change.move_to:
            out[change.move_to], out[change.path] = out[change.path], None
    return out


def lp1(body: str, path: str = "f.txt") -> str:
    return f"LP1\nF {path}\n{body}END\n"


# ---- LP1: the worked examples of docs/patch-formats.md ----


@pytest.mark.parametrize(
    ("before", "body", "after"),
    [
        ("a\nb\nc\nd\n", "R\nb\nc\n.\nX\n.\n", "a\nX\nd\n"),
        ("dup\nmid\ndup\n", "R 2\ndup\n.\nnew\n.\n", "dup\nmid\nnew\n"),
        ("anchor\nafter\n", "I\nanchor\n.\nins\n.\n", "anchor\nins\nafter\n"),
        ("before\nanchor\n", "P\nanchor\n.\nins\n.\n", "before\nins\nanchor\n"),
        ("only\n", "E\nonly\n.\n", ""),
        ("line", "N +\n", "line\n"),
        ("line\n", "N -\n", "line"),
        ("", "N +\n", "\n"),
        ("\n", "N -\n", ""),
        ("a\r\nb\r\n", "R\nb\n.\nB\n.\n", "a\r\nB\r\n"),  # CRLF kept
        ("\ufeffa\nb\n", "T\nc\n.\n", "\ufeffa\nb\nc\n"),  # BOM kept
        ("x\n", "B\n..dot\n.\n", ".dot\nx\n"),  # dot-stuffing
        ("a\n", "T\nb\n.\nB\nz\n.\n", "z\na\nb\n"),
    ],
)
def test_lp1_worked_examples(before: str, body: str, after: str) -> None:
    assert run(lp1(body), {"f.txt": before}) == {"f.txt": after}


def test_lp1_creates_files_with_t_and_quoted_paths() -> None:
    patch = 'LP1\n# a comment\nF "dir/with space.txt"\nT\nhello\n.\nEND\ntrailing text is ignored'
    assert run(patch, {}) == {"dir/with space.txt": "hello\n"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("F f.txt\nEND\n", "wrong header"),
        ("", "empty"),
        ("LP2\nEND\n", "wrong header"),
        ("LP1\nF f.txt\nT\nx\n.\n", "missing END"),
        ("LP1\nF\nEND\n", "without a path"),
        ('LP1\nF "open\nEND\n', "unterminated"),
        ("LP1\nF f.txt\nZ\nEND\n", "unknown operation"),
        ("LP1\nF f.txt\nR x\na\n.\nb\n.\nEND\n", "bad occurrence"),
        ("LP1\nF f.txt\nR 0\na\n.\nb\n.\nEND\n", "1 or more"),
        ("LP1\nF f.txt\nN *\nEND\n", "bad N flag"),
        ("LP1\nF f.txt\nR\n.x\n.\nb\n.\nEND\n", "dot-stuffing"),
        ("LP1\nF f.txt\nR\nmissing\n.\nb\n.\nEND\n", "not found"),
        ("LP1\nF f.txt\nR\ndup\n.\nb\n.\nEND\n", "not unique"),
        ("LP1\nF f.txt\nR 3\ndup\n.\nb\n.\nEND\n", "out of range"),
        ("LP1\nF new.txt\nR\na\n.\nb\n.\nEND\n", "does not exist"),
    ],
)
def test_lp1_errors_are_distinct(patch: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        run(patch, {"f.txt": "dup\nx\ndup\n"})


@pytest.mark.parametrize(("content", "message"), [(b"a\rb\n", "bare CR"), (b"\xff\xfe\n", "not UTF-8")])
def test_unpatchable_files(content: bytes, message: str) -> None:
    with pytest.raises(Exception, match=message):
        patches.apply(lp1("T\nx\n.\n"), lambda path: decode(content, path))


def test_mixed_line_endings_take_the_majority() -> None:
    assert run(lp1("T\nd\n.\n"), {"f.txt": "a\r\nb\r\nc\n"}) == {"f.txt": "a\r\nb\r\nc\r\nd\r\n"}
    assert run(lp1("T\nc\n.\n"), {"f.txt": "a\r\nb\n"}) == {"f.txt": "a\nb\nc\n"}  # a tie: LF


TEXT = st.text(alphabet=st.sampled_from(["a", "b", "é", "\u4e2d", " ", "\n"]), max_size=60)


@given(TEXT, st.booleans())
def test_a_patch_that_changes_nothing_round_trips_byte_for_byte(body: str, crlf: bool) -> None:
    original = body.replace("\n", "\r\n") if crlf else body
    assert run("LP1\nF f.txt\nEND\n", {"f.txt": original}) == {"f.txt": original}


@given(st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=12), st.sampled_from(["x", "y", "z"]))
def test_lp1_replace_uniqueness(lines: list[str], target: str) -> None:
    before = "\n".join(lines) + "\n"
    count = lines.count(target)
    patch = lp1(f"R\n{target}\n.\nNEW\n.\n")
    if count == 1:
        after = run(patch, {"f.txt": before})["f.txt"]
        assert after == before.replace(f"{target}\n", "NEW\n", 1) if lines[0] == target else after is not None
        assert after is not None and after.count("NEW") == 1
    else:
        with pytest.raises(PatchError, match="not found" if count == 0 else "not unique"):
            run(patch, {"f.txt": before})


# ---- Begin Patch ----

SPEC_EXAMPLE = """*** Begin Patch
*** Add File: docs/new.md
+first line of the new file
+second line
*** Update File: src/app.py
*** Move to: src/main.py
@@ def handler(request):
     context line (leading space)
-    removed line
+    added line
     context line
@@
-another removed line
+another added line
*** End of File
*** Delete File: old/unused.txt
*** End Patch
"""


def test_begin_patch_spec_example() -> None:
    app = (
        "import x\n"
        "def handler(request):\n"
        "    context line (leading space)\n"
        "    removed line\n"
        "    context line\n"
        "another removed line\n"
    )
    result = run(SPEC_EXAMPLE, {"src/app.py": app, "old/unused.txt": "bye\n"})
    assert result == {
        "docs/new.md": "first line of the new file\nsecond line\n",
        "src/app.py": None,
        "src/main.py": (
            "import x\n"
            "def handler(request):\n"
            "    context line (leading space)\n"
            "    added line\n"
            "    context line\n"
            "another added line\n"
        ),
        "old/unused.txt": None,
    }


def test_begin_patch_whitespace_tolerance_and_header_narrowing() -> None:
    before = "def a():\n    return 1\ndef b():\n    return 1\n"
    patch = "*** Begin Patch\n*** Update File: f.py\n@@ def b():\n-    return 1   \n+    return 2\n*** End Patch"
    assert run(patch, {"f.py": before}) == {"f.py": "def a():\n    return 1\ndef b():\n    return 2\n"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("*** Update File: f.py\n*** End Patch", "must start"),
        ("*** Begin Patch\n*** Update File: f.py\n@@\n-x\n+y\n", "must end"),
        ("*** Begin Patch\n*** Frobnicate File: f.py\n*** End Patch", "expected a file header"),
        ("*** Begin Patch\n*** Add File: f.py\n+x\n*** End Patch", "exists"),
        ("*** Begin Patch\n*** Delete File: nope.py\n*** End Patch", "does not exist"),
        ("*** Begin Patch\n*** Update File: f.py\n@@\n-missing\n+y\n*** End Patch", "hunk 1: old lines not found"),
        ("*** Begin Patch\n*** Update File: f.py\n@@\n-    return 1\n+x\n*** End Patch", "match 2 places"),
        ("*** Begin Patch\n*** Update File: f.py\n@@\n?bad\n*** End Patch", "must start with"),
        ("*** Begin Patch\n*** Add File: g.py\nno plus\n*** End Patch", "every line of an added file"),
    ],
)
def test_begin_patch_errors_name_file_and_hunk(patch: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        run(patch, {"f.py": "def a():\n    return 1\ndef b():\n    return 1\n"})


def test_format_detection() -> None:
    assert patches.detect("\n\n*** Begin Patch\n") == "begin_patch"
    assert patches.detect("# comment\nLP1\n") == "lp1"
    assert patches.paths(SPEC_EXAMPLE) == ["docs/new.md", "src/app.py", "src/main.py", "old/unused.txt"]
