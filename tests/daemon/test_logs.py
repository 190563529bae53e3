"""Logs: one key=value line per event, with journald priority prefixes only when
JOURNAL_STREAM names the daemon's own stderr."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import start_daemon
from toold_daemon.records.logs import EventFormatter, quoted


def record(level: int, message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("toold_daemon.server", level, __file__, 1, message, None, exc_info)


def test_journal_lines_carry_the_priority_and_stay_one_line() -> None:
    journal = EventFormatter(journal=True)
    assert journal.format(record(logging.ERROR, 'bad "thing"')) == '<3>level=error logger=server msg="bad \\"thing\\""'
    assert journal.format(record(logging.DEBUG, "x")).startswith("<7>level=debug")
    assert journal.format(record(logging.WARNING, "x")).startswith("<4>")
    with_traceback = journal.format(record(logging.ERROR, "failed", exc=True))
    assert "\n" not in with_traceback and "Traceback" in with_traceback and "ValueError: boom" in with_traceback


def test_a_terminal_gets_no_prefix() -> None:
    line = EventFormatter(journal=False).format(record(logging.INFO, "serving"))
    assert line == 'level=info logger=server msg="serving"'


def test_the_daemon_prefixes_only_when_stderr_is_the_journal(tmp_path: Path) -> None:
    for journal in (True, False):
        tmp = tmp_path / str(journal)
        root = tmp / "root"
        root.mkdir(parents=True)
        log = tmp / "daemon.log"
        log.touch()
        st = os.stat(log)
        stream = f"{st.st_dev}:{st.st_ino}" if journal else f"{st.st_dev}:{st.st_ino + 1}"  # someone else's
        d = start_daemon(tmp, root, "--log-level", "INFO", env={"JOURNAL_STREAM": stream})
        d.stop()
        lines = [line for line in log.read_text().splitlines() if line]
        assert lines, "the daemon logged nothing at INFO"
        if journal:
            assert all(line.startswith(("<6>level=info", "<4>level=warning", "<3>level=error")) for line in lines), (
                lines
            )
        else:
            assert all(line.startswith("level=") for line in lines), lines


def _quoted_the_long_way(text: str) -> str:
    """Every character looked at: what ``quoted`` must give, whatever path it takes."""
    out = []
    for char in text:
        if char in '\\"':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif (ord(char) < 0x20 and char != "\t") or 0x7F <= ord(char) <= 0x9F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@given(st.text())
def test_a_quoted_text_escapes_every_quote_backslash_and_control_character(text: str) -> None:
    assert quoted(text) == _quoted_the_long_way(text)


@given(st.text(alphabet=st.sampled_from('ab1_.:/@+-="\\ \n\r\t\x00\x1b\x7f\x85\u2028é')))
def test_a_quoted_text_of_the_characters_that_matter_escapes_them(text: str) -> None:
    assert quoted(text) == _quoted_the_long_way(text)
    assert "\n" not in quoted(text) and "\r" not in quoted(text)
