"""Turning a response body into what a model wants to read.

HTML becomes readable text (title, headings, paragraphs, list items, table rows, links
as ``text (url)``) without scripts, styles or navigation chrome; JSON is pretty-printed;
other text passes as it is; binary types are described, never dumped. The charset
comes from the header, then the document's ``<meta>``, then the bytes themselves.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Literal
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser, LexborNode, SelectolaxError

from .nesting import MAX_NESTING, nests_deeper_than, plain_text

Kind = Literal["html", "json", "text", "binary"]

_TEXT_TYPES = ("application/xml", "application/javascript", "application/ecmascript", "application/x-sh",
               "application/toml", "application/yaml", "application/x-yaml", "application/sql",
               "application/x-www-form-urlencoded", "image/svg+xml")  # fmt: skip
_BINARY_PREFIXES = ("image/", "audio/", "video/", "font/", "model/")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
_BLANK_LINES = re.compile(r"\n{3,}")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" ([,.;:!?)\]])")


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def kind_of(content_type: str, head: bytes) -> Kind:
    """What the body is, from its declared type, or from its first bytes when the type
    is missing or says nothing (``application/octet-stream`` that is really text)."""
    media = media_type(content_type)
    if media in ("text/html", "application/xhtml+xml"):
        return "html"
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media.startswith("text/") or media.endswith("+xml") or media in _TEXT_TYPES:
        return "text"
    if media.startswith(_BINARY_PREFIXES) or (media and media != "application/octet-stream"):
        return "binary"
    return sniff(head)


def sniff(head: bytes) -> Kind:
    if b"\0" in head[:4096]:
        return "binary"
    start = head[:512].lstrip().lower()
    if start.startswith((b"<!doctype html", b"<html")):
        return "html"
    if start[:1] in (b"{", b"["):
        return "json"
    sample = head[:4096]
    text_bytes = sum(1 for b in sample if b >= 0x20 or b in (9, 10, 13))
    return "text" if not sample or text_bytes / len(sample) > 0.9 else "binary"


def charset_of(content_type: str) -> str | None:
    match = re.search(r"charset\s*=\s*\"?([A-Za-z0-9._:-]+)", content_type, re.IGNORECASE)
    return _known(match.group(1)) if match else None


def _known(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode(body: bytes, content_type: str, kind: Kind) -> str:
    """The body as text: the header's charset, then ``<meta charset>`` for HTML, then a
    byte order mark, then UTF-8 if the bytes are valid UTF-8, else Windows-1252 (what
    browsers assume for unlabelled Western pages)."""
    charset = charset_of(content_type)
    if charset is None and kind == "html":
        match = _META_CHARSET.search(body[:4096])
        charset = _known(match.group(1).decode("ascii")) if match else None
    if charset is not None:
        return body.decode(charset, errors="replace")
    for bom, encoding in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            return body.decode(encoding, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if len(body) - exc.start < 4:  # only the cut at the download limit split a character
            return body.decode("utf-8", errors="replace")
        return body.decode("cp1252", errors="replace")


def pretty_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text  # cut by the download limit, or not JSON after all: as it is


class SelectorError(ValueError):
    pass


# Never text for a reader: code, styling, and what a page wraps around its content.
_ALWAYS_DROPPED = ("script", "style", "noscript", "template", "svg", "iframe", "object", "embed", "canvas")
_CHROME = ("nav", "[role=navigation]", "[role=banner]", "[role=contentinfo]", "[role=menubar]", "[role=menu]",
           "body > header", "body > footer", "[aria-hidden=true]", "button", "select", "input", "textarea")  # fmt: skip
_BLOCKS = frozenset(
    {"address", "article", "aside", "blockquote", "body", "caption", "center", "dd", "details", "dialog", "div",
     "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
     "header", "hgroup", "hr", "li", "main", "menu", "ol", "p", "pre", "section", "summary", "table", "tbody",
     "thead", "tfoot", "tr", "ul"}
)  # fmt: skip
_HEADINGS = {f"h{n}": n for n in range(1, 7)}


def html_text(html: str, base_url: str, selector: str | None = None) -> tuple[str, int]:
    """Readable text of a page, or of the elements ``selector`` matches:
    (text, how many elements matched; 1 for the whole page). A page nested beyond
    reason is read as plain text (see ``nesting``); no selector applies to it."""
    if nests_deeper_than(html, MAX_NESTING):
        if selector:
            raise SelectorError(
                f"the page nests elements more than {MAX_NESTING} deep, too deep to select from; "
                "fetch it without a selector for its plain text"
            )
        return f"[elements nested more than {MAX_NESTING} deep: the page's plain text]\n\n{plain_text(html)}", 1
    tree = LexborHTMLParser(html)
    for node in tree.css(", ".join(_ALWAYS_DROPPED)):
        node.decompose()
    if selector:
        try:
            matches = tree.css(selector)
        except SelectolaxError:
            raise SelectorError(f"not a CSS selector: {selector[:200]!r}") from None
        return "\n\n".join(filter(None, (_render(node, base_url) for node in matches))), len(matches)
    for node in tree.css(", ".join(_CHROME)):
        node.decompose()
    title_node = tree.css_first("title")
    title = _WHITESPACE.sub(" ", title_node.text()).strip() if title_node is not None else ""
    body = tree.body
    text = _render(body, base_url) if body is not None else ""
    return (f"Title: {title}\n\n{text}" if title else text), 1


def _render(node: LexborNode, base_url: str) -> str:
    renderer = _Renderer(base_url)
    try:
        renderer.walk(node, depth=0)
    except RecursionError:  # a page nested beyond reason: its plain text will do
        return _WHITESPACE.sub(" ", node.text(separator=" ")).strip()
    renderer.flush()
    return _BLANK_LINES.sub("\n\n", "\n".join(renderer.lines)).strip()


class _Renderer:
    """Walks the tree once: inline text collects into a line, each block ends one."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.lines: list[str] = []
        self.inline: list[str] = []
        self.prefix: list[str] = []

    def walk(self, node: LexborNode, depth: int) -> None:
        tag = node.tag or ""
        if tag == "-text":
            self.inline.append(_WHITESPACE.sub(" ", node.text_content or ""))
            return
        if tag.startswith("-"):
            return  # comments, doctype
        if tag == "br":
            self.flush()
            return
        if tag == "a":
            self._link(node)
            return
        if tag == "img":
            alt = (node.attributes.get("alt") or "").strip()
            if alt:
                self.inline.append(f" [image: {alt}] ")
            return
        if tag == "pre":
            self.flush()
            self.lines.extend(["", node.text(deep=True).rstrip(), ""])
            return
        if tag == "tr":
            self.flush()
            cells = [_inline_text(cell, self.base_url) for cell in node.iter() if cell.tag in ("td", "th")]
            if any(cells):
                self.lines.append(" | ".join(cells))
            return
        block = tag in _BLOCKS
        if block:
            self.flush()
        if tag in _HEADINGS:
            self.lines.append("")
            self.prefix.append("#" * _HEADINGS[tag] + " ")
        elif tag == "li":
            self.prefix.append("- ")
        elif tag in ("ul", "ol"):
            self.prefix.append("  " if any(p == "- " for p in self.prefix) else "")
        for child in node.iter(include_text=True):
            self.walk(child, depth + 1)
        if block:
            self.flush()
        if tag in _HEADINGS or tag in ("li", "ul", "ol"):
            self.prefix.pop()
        if tag in ("p", "table", "blockquote") or tag in _HEADINGS:
            self.lines.append("")

    def _link(self, node: LexborNode) -> None:
        text = _inline_text(node, self.base_url, links=False)
        href = (node.attributes.get("href") or "").strip()
        if not href or href.startswith(("#", "javascript:", "mailto:", "data:")):
            self.inline.append(f" {text} " if text else "")
            return
        url = urljoin(self.base_url, href)
        self.inline.append(f" {text} ({url}) " if text and text != url else f" {url} ")

    def flush(self) -> None:
        text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", _WHITESPACE.sub(" ", "".join(self.inline)).strip())
        self.inline = []
        if text:
            indent = "".join(p for p in self.prefix if not p.strip())
            marker = next((p for p in reversed(self.prefix) if p.strip()), "")
            self.lines.append(indent + marker + text)


def _inline_text(node: LexborNode, base_url: str, *, links: bool = True) -> str:
    renderer = _Renderer(base_url)
    for child in node.iter(include_text=True):
        if child.tag == "a" and not links:
            renderer.inline.append(child.text(deep=True))
        elif child.tag in _BLOCKS:
            renderer.inline.append(" " + _inline_text(child, base_url, links=links) + " ")
        else:
            renderer.walk(child, depth=0)
    return _WHITESPACE.sub(" ", " ".join([*renderer.lines, "".join(renderer.inline)])).strip()
