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

#: Elements still open at once past which a page is read as plain text (the parser takes
#: about 20 ms at this depth here).
MAX_NESTING = 2048

# A tag: its name, whether it closes, and the rest up to ">" (a "<" ends the scan of
# one, so a page of "<" without ">" stays linear).
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]*)[^<>]*>?|<!--")
_SELF_CLOSING = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr",
     "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup", "caption",
     "rb", "rt", "rp", "rtc", "html", "head", "body"}
)  # fmt: skip
# Elements whose content is text up to their end tag: never rendered, never counted.
_RAW_TEXT = frozenset({"script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "noscript"})
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
    skip_to = 0  # the end of a comment or raw text being passed over
    for tag in _TAG.finditer(page):
        if tag.start() < skip_to:
            continue
        closing, name = tag.group(1, 2)
        if name is None:
            skip_to = _end_of_raw_text(page, "!--", tag.end())
            if skip_to == len(page):
                break
            continue
        name = name.lower()
        if name in _SELF_CLOSING:
            continue
        if closing:
            if open_by_name.get(name):
                open_by_name[name] -= 1
                depth -= 1
        elif name in _END_OF:
            skip_to = _end_of_raw_text(page, name, tag.end())
            if skip_to == len(page):
                break
        else:
            open_by_name[name] = open_by_name.get(name, 0) + 1
            depth += 1
            if depth > limit:
                return True
    return False


def _name(tag: re.Match[str]) -> str:
    """The lowercased name of a tag ``_TAG`` found; "!--" for a comment."""
    name = tag.group(2)
    return "!--" if name is None else name.lower()


def plain_text(page: str) -> str:
    """The text between a page's tags, entities decoded and spaces collapsed, without
    what raw-text elements hold (scripts, styles)."""
    pieces: list[str] = []
    position = 0
    while (tag := _TAG.search(page, position)) is not None:
        pieces.append(page[position : tag.start()])
        position = tag.end()
        name = _name(tag)
        if not tag.group(1) and name in _END_OF:
            position = _end_of_raw_text(page, name, position)
        pieces.append(" ")
    pieces.append(page[position:])
    return _WHITESPACE.sub(" ", html.unescape("".join(pieces))).strip()


def _end_of_raw_text(page: str, name: str, position: int) -> int:
    """Where the raw text of element ``name`` (or a comment) that starts at ``position``
    ends: after its end tag, or at the page's end when it has none."""
    end = _END_OF[name].search(page, position)
    return len(page) if end is None else end.end()
