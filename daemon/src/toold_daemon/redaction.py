"""What a person is shown, made safe to show: credentials hidden from summaries, the policy's reasons, the call's
arguments in a confirmation (``toolctl pending``, ``watch``, MCP elicitation) and logs.

A value that follows a credential-looking name (``token=…``, ``API_KEY=…``,
``PASSWORD: …``, ``Authorization: Bearer …``) or the word ``bearer`` is replaced by
``***``; the name stays, so the person still sees what kind of thing was passed.
"""

from __future__ import annotations

import re
from typing import Any

_SECRET = re.compile(
    r"(?i)((?:api[_-]?key|token|secret|password|passwd|authorization)\s*[=:]\s*(?:(?:bearer|basic|token)\s+)?"
    r"|bearer\s+)([^\s'\",;&]+)"
)
_SECRET_NAME = re.compile(r"(?i)api[_-]?key|token|secret|password|passwd|authorization|credential")


#: Letters ``_SECRET`` (case-insensitive) takes for ``s`` and ``i`` but ``str.lower``
#: keeps apart (the long s, the dotless i, and the dot ``İ`` leaves when lowered).
_FOLDED_APART = str.maketrans({"\u017f": "s", "\u0131": "i", "\u0307": None})


def hide_secrets(text: str) -> str:
    # Every match of ``_SECRET`` contains one of these words: texts without any, nearly all
    # of them, skip the regular expression (a tenth of its cost on a summary). Spelled out,
    # the test costs a third of ``any`` over a tuple (every audit record passes here).
    lowered = text.lower()
    if not lowered.isascii():
        lowered = lowered.translate(_FOLDED_APART)  # "ſecret=…" is hidden as "secret=…" is
    if not (
        "key" in lowered
        or "token" in lowered
        or "secret" in lowered
        or "passw" in lowered
        or "authorization" in lowered
        or "bearer" in lowered
    ):
        return text
    return _SECRET.sub(lambda m: m.group(1) + "***", text)


def hide_secrets_in(value: Any) -> Any:
    """``value`` (decoded arguments) with every string's credentials hidden, and the whole
    value of a key that names a credential (``{"api_key": "…"}``) replaced."""
    if isinstance(value, str):
        return hide_secrets(value)
    if isinstance(value, list):
        return [hide_secrets_in(v) for v in value]
    if isinstance(value, dict):
        return {
            k: "***" if isinstance(k, str) and _SECRET_NAME.search(k) and isinstance(v, str) else hide_secrets_in(v)
            for k, v in value.items()
        }
    return value


def show_blanks(text: str) -> str:
    """Newlines as ⏎ and runs of four or more blanks as ␣×N."""
    text = text.replace("\n", " ⏎ ")
    return re.sub(r"[ \t]{4,}", lambda m: f" ␣×{len(m.group())} ", text)
