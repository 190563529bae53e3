"""Pages nested beyond reason, found before the HTML parser sees them.

The parser's time grows with the square of how deeply elements nest: each start tag
looks through the elements still open (50,000 nested ``<div>`` take it 12 s, 100,000 a
minute), so a hostile page would hold a fetch until its timeout. ``nests_deeper_than``
reads the tags once, in time linear in the page, and estimates how deep the elements
that need an end tag go; past ``MAX_NESTING`` the page is read as plain text instead
(``plain_text``, also linear). The look costs a tenth of what rendering a page does
(35 ms for 430 KB of 40,000 tags here, against 330-420 ms), and nothing for a page of
fewer than ``MAX_NESTING`` tags.

The estimate leans deep: an unclosed element counts until the end, and an end tag
closes one element of its name only when one is open. Elements whose end tag may be left
out (``p``, ``li``, ``td``...) and void ones (``br``, ``img``...) do not count, since
the parser closes them itself; a long page of unclosed paragraphs is flat to it.
Comments and the text of scripts and styles are skipped as the parser skips them. It is
a screen, not a bound: a page built to look shallow (end tags hidden in attribute
values, say) is parsed, and holds only its own call, until the call's timeout.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

#: Elements still open at once past which a page is read as plain text (the parser takes
#: about 20 ms at this depth here).
MAX_NESTING = 2048

# A tag: its name, whether it closes, and the rest up to ">" (a "<" ends the scan of
# one, so a page of "<" without ">" stays linear).
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)[^<>]*>?|<!--")
# Void elements, and those whose end tag may be left out: the parser closes them itself.
_NOT_COUNTED = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr",
     "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup", "caption",
     "rb", "rt", "rp", "rtc", "html", "head", "body"}
)  # fmt: skip
# Elements whose content is text up to their end tag: never rendered, never counted.
_RAW_TEXT = frozenset({"script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "noscript"})
#: Where a comment, or each raw-text element's text, ends.
_END_OF = {name: re.compile(f"</{name}(?=[\\s/>])[^>]*>?", re.IGNORECASE) for name in _RAW_TEXT}
_END_OF["!--"] = re.compile("-->")
_WHITESPACE = re.compile(r"\s+")


def nests_deeper_than(page: str, limit: int = MAX_NESTING) -> bool:
    """Whether elements that need an end tag nest more than ``limit`` deep in ``page``,
    estimated from its tags."""
    if page.count("<") <= limit:
        return False  # too few tags to nest that deep
    depth = 0
    open_by_name: dict[str, int] = {}
    for _start, _end, closing, name in _markup(page):
        if name is None or name in _NOT_COUNTED:
            continue
        if closing:
            if open_by_name.get(name):
                open_by_name[name] -= 1
                depth -= 1
        else:
            open_by_name[name] = open_by_name.get(name, 0) + 1
            depth += 1
            if depth > limit:
                return True
    return False


def plain_text(page: str) -> str:
    """The text between a page's tags, entities decoded and spaces collapsed, without
    comments and what raw-text elements hold (scripts, styles)."""
    pieces: list[str] = []
    position = 0
    for start, end, _closing, _name in _markup(page):
        pieces.append(page[position:start])
        pieces.append(" ")
        position = end
    pieces.append(page[position:])
    return _WHITESPACE.sub(" ", html.unescape("".join(pieces))).strip()


def _markup(page: str) -> Iterator[tuple[int, int, bool, str | None]]:
    """The page's markup in order, as the parser reads it: (start, end, closing, the
    lowercased name) for a tag; name None for a comment, or a raw-text element (script,
    style...) with its text and end tag, each passed over whole. Linear in the page:
    each search goes on from where the last one ended."""
    position = 0
    while (tag := _TAG.search(page, position)) is not None:
        closing, name = bool(tag.group(1)), tag.group(2)
        if name is not None:
            name = name.lower()
            if closing or name not in _RAW_TEXT:
                position = tag.end()
                yield tag.start(), position, closing, name
                continue
        end = _END_OF[name or "!--"].search(page, tag.end())
        position = len(page) if end is None else end.end()
        yield tag.start(), position, False, None
