"""Making text safe to show in a terminal. Standard library only: clients use it too.

Escape sequences (CSI, OSC, DCS, SOS, PM, APC and two-character escapes, in their
7-bit and 8-bit forms) are removed; ``\r\n`` becomes ``\n``; a lone carriage return
(which would let later text overwrite what came before it on the line), other C0
controls except tab and newline, DEL, C1 controls, and the bidi overrides and isolates that make
text read differently from what it is (CVE-2021-42574) become U+FFFD.
"""

from __future__ import annotations

import re

# ESC-introduced sequences: CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC (ESC ] ... BEL or ST),
# and two-character escapes (ESC followed by one byte). Also their 8-bit C1 forms.
_ESCAPES = re.compile(
    r"""
    \x1b\[[0-?]*[ -/]*[@-~]?            # CSI
    | \x9b[0-?]*[ -/]*[@-~]?            # 8-bit CSI
    | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)   # OSC DCS SOS PM APC
    | \x1b[@-Z\\-~]?                    # other two-character escapes (or a lone ESC)
    """,
    re.VERBOSE | re.DOTALL,
)
# C0 controls except \t \n (a lone \r included), DEL, C1 controls, and the bidi overrides/isolates
# that can make text read differently from what it is (CVE-2021-42574).
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\r\x0e-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


#: The ASCII characters that are not printable, tab and newline aside (ESC and CR included).
_ASCII_UNPRINTABLE = bytes(c for c in range(32) if c not in (9, 10)) + b"\x7f"


def sanitize_for_terminal(text: str) -> str:
    """Remove escape sequences and replace other control characters with U+FFFD."""
    # Fast paths. ASCII text (most tool output) needs no work when deleting its
    # unprintable bytes deletes nothing: one C pass, a quarter of the time of the check
    # below. Otherwise str.isprintable is false for every control, format (bidi) and
    # unassigned character, so text printable apart from tab/newline needs no work.
    if text.isascii():
        raw = text.encode("ascii")
        if len(raw.translate(None, _ASCII_UNPRINTABLE)) == len(raw):
            return text
    elif text.replace("\n", "").replace("\t", "").isprintable() or not _needs_work(text):
        return text
    return _CONTROLS.sub("\ufffd", _ESCAPES.sub("", text.replace("\r\n", "\n")))


def _needs_work(text: str) -> bool:
    return _CONTROLS.search(text) is not None or "\x1b" in text or "\r" in text
