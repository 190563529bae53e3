"""How the daemon logs: one line per event on stderr, ``key=value`` fields, and the
syslog priority prefix (``<3>`` error ... ``<7>`` debug) when stderr is the journal.

systemd says stderr goes to the journal by setting ``JOURNAL_STREAM`` to the device
and inode of that stream; journald then takes ``<N>`` at the start of a line as the
entry's priority. Newlines and other control characters inside a message (a traceback, a name a
client chose) are escaped everywhere, so one event stays one line and nobody can
forge a line, a priority or a terminal escape through what they send.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import TextIO

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def stderr_is_journal(stream: TextIO = sys.stderr, environ: dict[str, str] | None = None) -> bool:
    """True when ``JOURNAL_STREAM`` names this very stream (not one a parent had)."""
    value = (environ if environ is not None else os.environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    try:
        st = os.fstat(stream.fileno())
        return bool(value) and (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):
        return False


class EventFormatter(logging.Formatter):
    """``level=warning logger=server msg="..."``, with ``<N>`` first for the journal."""

    def __init__(self, *, journal: bool) -> None:
        super().__init__()
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        logger = record.name.removeprefix("toold_daemon.")
        line = f"level={record.levelname.lower()} logger={logger} msg={quoted(message)}"
        if self.journal:
            return f"<{_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def quoted(text: str) -> str:
    """``text`` in double quotes, with backslashes, quotes and control characters escaped
    (a line it is written into stays one line that says what it said)."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # nearly every text: nothing to escape (no control character is printable)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped) + '"'


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EventFormatter(journal=stderr_is_journal()))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is the tool's business
