"""Reading a command for the policy, and checking its words against the denied files, run
on the event loop: their cost is bounded whatever a client sends, and the bounds never
let a command through unread (past them it is unreadable, and asked about)."""

from __future__ import annotations

import gc
import os
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import link_trees
from toold_daemon.config import Config
from toold_daemon.policy.shell import MAX_COMMAND_CHARS, MAX_STEPS, MAX_WORDS, _check_characters, read_command
from toold_daemon.policy.shell_parts import Unreadable
from toold_daemon.sandbox import Sandbox, build_sandbox
from toold_daemon.sandbox.lookups import WouldBlock, from_the_caches_alone
from toold_daemon.sandbox.named import _real_path, denied_words


def test_a_command_of_more_words_than_the_reader_takes_is_unreadable() -> None:
    assert len(read_command("echo " + "a " * (MAX_WORDS - 2))) == 1
    with pytest.raises(Unreadable, match="more than 512 words"):
        read_command("echo " + "a " * MAX_WORDS)
    with pytest.raises(Unreadable, match="words and substitutions"):
        read_command("a;" * MAX_WORDS)  # every part's word counts
    with pytest.raises(Unreadable, match="words and substitutions"):
        read_command("echo " + "$(b)" * MAX_WORDS)  # so does every substitution


def test_characters_read_one_at_a_time_are_bounded_too() -> None:
    assert read_command("echo " + "\\a" * (MAX_STEPS - 10))[0].words[1] == "a" * (MAX_STEPS - 10)
    over = MAX_STEPS + 1
    for command in ("echo " + "\\a" * over, "echo " + "$a" * over, 'echo "' + "$a" * over + '"'):
        with pytest.raises(Unreadable, match="quotes, escapes and operators"):
            read_command(command)


def _characters(keep: Callable[[str], bool]) -> list[str]:
    return [ch for ch in map(chr, range(0x80, 0x30000)) if ch.isprintable() and keep(ch)]


_OPERATORS = frozenset(";&|<>()$`'\"\\#\n{}*?[]~!=")
#: Symbols and punctuation already in NFKC (about 7,000): each has its category looked up.
_SYMBOLS = _characters(lambda ch: unicodedata.category(ch)[0] in "PS" and unicodedata.normalize("NFKC", ch) == ch)
#: Letters and digits NFKC changes (about 3,700, "ﬁ", "①"...) without making an operator
#: of them: the whole text is not in NFKC, so each distinct character is normalised.
_COMPATIBLE = _characters(
    lambda ch: unicodedata.category(ch)[0] not in "PS" and _OPERATORS.isdisjoint(unicodedata.normalize("NFKC", ch))
)


@pytest.mark.parametrize(
    "command",
    [
        "a " * (MAX_COMMAND_CHARS // 2),  # words
        "a;" * (MAX_COMMAND_CHARS // 2),  # parts
        "echo " + "$a" * 30_000,  # each expansion sliced the rest of the text (quadratic)
        "echo " + "".join(chr(0x4E00 + i) for i in range(20_000)),  # distinct characters outside ASCII
        'echo "' + "".join(_SYMBOLS)[:60_000] + '"',  # every distinct symbol that may stand quoted
        "echo " + "".join(_COMPATIBLE)[:60_000] + "\uff1b",  # normalised one by one to find the fullwidth ;
        "ls " + "*" * 60_000,  # a glob character at a time
        "echo `" + "a" * 60_000 + "`",
        "nice " * 12_000 + "x",  # wrappers unwrapped one by one
    ],
    ids=["words", "parts", "expansions", "wide", "symbols", "compatible", "glob", "backticks", "wrappers"],
)
def test_reading_any_64_kb_command_takes_milliseconds(command: str) -> None:
    command = command[: MAX_COMMAND_CHARS - _TRIES]

    def read(attempt: int) -> None:
        try:
            read_command(command + " " * attempt)  # never read before: no cached reading
        except Unreadable:
            pass

    # Each of these took 40-210 ms before the bounds (and ~65 s for the wrappers); the
    # slowest now take 5-13 ms here (8192 expansions, 7,000 distinct symbols).
    assert _least_cpu_seconds(read) < 0.03


#: Each timed check runs this many times and keeps its least CPU time.
_TRIES = 3


def _least_cpu_seconds(work: Callable[[int], object]) -> float:
    """The least CPU time of this thread over ``_TRIES`` runs of ``work(attempt)`` (attempt
    1, 2, ...), each with the garbage collector off: the suite's process is large, and one
    collection would be charged to the code under test; so would a run that another
    process's cache traffic slowed down, or (with the process's CPU time) another thread
    of the suite's process. CPU time, not wall time: waiting for the CPU does not count."""
    least = float("inf")
    for attempt in range(1, _TRIES + 1):
        gc.disable()
        try:
            started = time.thread_time()
            work(attempt)
            least = min(least, time.thread_time() - started)
        finally:
            gc.enable()
    return least


@pytest.mark.parametrize(
    ("command", "readable"),
    [
        ("echo a\u00a7b", False),  # unquoted punctuation outside ASCII
        ('echo "a\u00a7b"', True),
        ("echo 中文", True),
        ("echo a\uff1bb", False),  # a fullwidth semicolon
        ("echo a\u00a0b", False),  # a no-break space
        ("echo a\u2028b", False),  # a line separator
        ("echo a\u200bb", False),  # an invisible one
        ("echo é", True),
        ("echo a\ufe64\u0338b", False),  # a small < that NFKC of the pair would compose into ≮
        ('echo "\u2260"', True),  # ≠ is not = to the shell, and NFKC keeps it whole
    ],
)
def test_characters_outside_ascii_are_judged_as_before(command: str, readable: bool) -> None:
    try:
        read_command(command)
    except Unreadable:
        assert not readable
    else:
        assert readable


def _judged_one_by_one(command: str) -> frozenset[str] | None:
    """The plain reading of the character rules, a character at a time: None where the
    command is refused, else its punctuation and symbols outside ASCII."""
    invisible = {"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"}
    punctuation: set[str] = set()
    for ch in command:
        if ch.isascii():
            if (ch < " " and ch not in "\t\n") or ch == "\x7f":
                return None
            continue
        category = unicodedata.category(ch)
        if category in invisible or not _OPERATORS.isdisjoint(unicodedata.normalize("NFKC", ch)):
            return None
        if category[0] in "PS":
            punctuation.add(ch)
    return frozenset(punctuation)


#: Characters from every part of the rules: ASCII, look-alikes of operators (fullwidth,
#: small and compatibility forms), combining marks, invisible and unassigned ones,
#: symbols, letters that NFKC changes.
_TRICKY = st.sampled_from(
    list(
        "a;$ \t\n\x01\x7f"
        "é\u0301\u0338\uff1b\ufe64\u2474\u226e\u2260\ufb01"
        "\u00a0\u200b\u2028\U000e0001\u0378\u00a7\u2603中"
    )
)


@settings(max_examples=400, deadline=None)
@given(st.text(st.one_of(_TRICKY, st.characters()), max_size=12))
@example("e\u0301\ufe64\u0338")
def test_the_whole_text_checks_judge_as_a_character_at_a_time(text: str) -> None:
    expected = _judged_one_by_one(text)
    try:
        punctuation = _check_characters(text)
    except Unreadable:
        assert expected is None
    else:
        assert punctuation == expected


def test_the_character_refused_is_named() -> None:
    with pytest.raises(Unreadable, match="'\uff1b' looks like"):
        read_command("echo " + "中文é" * 1000 + "\uff1b\u2474" + "中" * 1000)
    with pytest.raises(Unreadable, match=r"'\\u200b' is invisible"):
        read_command("echo " + "中文é" * 1000 + "\u200b")


def test_the_denied_check_of_many_words_takes_milliseconds(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "er" / "ws"
    root.mkdir(parents=True)
    sandbox = build_sandbox(Config(), [root])

    def check(_attempt: int) -> None:
        assert denied_words(sandbox, [f"w{i}" for i in range(511)], str(root)) is None
        assert denied_words(sandbox, ["ls", "-la", "x"] * 170, str(root)) is None

    assert _least_cpu_seconds(check) < 0.03  # 35 µs a word before: 36 ms for these; 6 ms now


def test_a_word_naming_a_denied_file_through_a_link_is_still_found(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / ".env").write_text("SECRET=1\n")
    (root / "notes").symlink_to(".env")
    (root / "sub" / "up").symlink_to("..")
    sandbox = build_sandbox(Config(), [root])
    words = [f"w{i}" for i in range(100)]
    assert denied_words(sandbox, [*words, "notes"], str(root)) is not None
    assert denied_words(sandbox, [*words, "sub/up/.env"], str(root)) is not None
    assert denied_words(sandbox, [*words, "up/notes"], str(root / "sub")) is not None


@settings(max_examples=150, deadline=None)
@given(
    drawn=link_trees.entries(),
    asked=st.lists(st.lists(st.sampled_from([*link_trees.NAMES, "..", "."]), min_size=1, max_size=4), max_size=10),
)
def test_real_paths_worked_out_per_directory_equal_realpath(
    tmp_path_factory: pytest.TempPathFactory, drawn: link_trees.Entries, asked: list[list[str]]
) -> None:
    base = str(tmp_path_factory.mktemp("tree"))
    link_trees.make_tree(base, drawn)
    sandbox = Sandbox([base])
    real_dirs: dict[str, str] = {}
    for parts in asked:
        absolute = os.path.normpath(os.path.join(base, *parts))
        if _loops(absolute):
            continue  # the kernel refuses such a path (ELOOP); realpath's answer is arbitrary
        assert _real_path(sandbox, absolute, real_dirs) == os.path.realpath(absolute)
        # On the event loop: the same answer, or none at all (the batch is then planned on a thread).
        try:
            with from_the_caches_alone():
                on_loop = _real_path(sandbox, absolute, {})
        except WouldBlock:
            continue
        assert on_loop == os.path.realpath(absolute)


def _loops(path: str) -> bool:
    while path != "/":
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == 40:
                return True
        path = os.path.dirname(path)
    return False
