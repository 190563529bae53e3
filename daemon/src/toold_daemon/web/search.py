"""Search backends for ``web_search``: SearXNG, the Brave Search API, or a command.

Each returns at most ``count`` hits, with titles, URLs and snippets reduced to plain,
bounded text (backends put markup like ``<strong>`` in snippets). An answer that is not
the documented JSON is a ``SearchFailed``, never a crash. API keys go into a request
header and nowhere else: not into a message, a result or a log line.
"""

from __future__ import annotations

import html
import os
import re
import selectors
import subprocess
import time
from typing import TypeVar

import httpx
import msgspec

from .fetch import tls_context

T = TypeVar("T")
MAX_ANSWER_BYTES = 4 * 1024 * 1024
BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
_TAG = re.compile(r"<[^>]{0,200}>")
_WHITESPACE = re.compile(r"\s+")
_LIMITS = {"title": 300, "url": 2048, "snippet": 1000}


class SearchFailed(Exception):
    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timeout = timeout


class Hit(msgspec.Struct, frozen=True):
    title: str
    url: str
    snippet: str


class _SearxResult(msgspec.Struct):
    title: str | None = None
    url: str | None = None
    content: str | None = None


class _SearxAnswer(msgspec.Struct):
    results: list[_SearxResult] = []


class _BraveResult(msgspec.Struct):
    title: str | None = None
    url: str | None = None
    description: str | None = None


class _BraveWeb(msgspec.Struct):
    results: list[_BraveResult] = []


class _BraveAnswer(msgspec.Struct):
    web: _BraveWeb | None = None


class _CommandHit(msgspec.Struct):
    title: str | None = None
    url: str | None = None
    snippet: str | None = None


def plain(text: str | None, field: str) -> str:
    """Markup and entities removed, whitespace collapsed, bounded."""
    cleaned = _WHITESPACE.sub(" ", html.unescape(_TAG.sub("", text or ""))).strip()
    limit = _LIMITS[field]
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def hits(triples: list[tuple[str | None, str | None, str | None]], count: int) -> list[Hit]:
    found = [Hit(plain(t, "title"), plain(u, "url"), plain(s, "snippet")) for t, u, s in triples if u]
    return found[:count]


def searxng(base_url: str, query: str, count: int, timeout: float) -> list[Hit]:
    """``GET {url}/search?q=…&format=json``; hits from ``results[].title/url/content``."""
    body = _get(f"{base_url.rstrip('/')}/search", {"q": query, "format": "json"}, {}, timeout, "SearXNG")
    answer = _decode(body, _SearxAnswer, "SearXNG")
    return hits([(r.title, r.url, r.content) for r in answer.results], count)


def brave(url: str, key: str, query: str, count: int, timeout: float) -> list[Hit]:
    """The Brave Search API: ``X-Subscription-Token``; hits from ``web.results[]``."""
    headers = {"Accept": "application/json", "X-Subscription-Token": key}
    body = _get(url or BRAVE_URL, {"q": query, "count": str(count)}, headers, timeout, "Brave Search")
    answer = _decode(body, _BraveAnswer, "Brave Search")
    results = answer.web.results if answer.web is not None else []
    return hits([(r.title, r.url, r.description) for r in results], count)


def command(argv: list[str], query: str, count: int, timeout: float) -> list[Hit]:
    """Run ``argv + [query]`` (no shell); it prints ``[{title, url, snippet}]`` as JSON."""
    out, err, code = _run_bounded([*argv, query], timeout)
    if code != 0:
        detail = err.decode("utf-8", "replace").strip()[-300:]
        raise SearchFailed(f"the search command exited with {code}" + (f": {detail}" if detail else ""))
    answer = _decode(out, list[_CommandHit], "the search command")
    return hits([(h.title, h.url, h.snippet) for h in answer], count)


def _get(url: str, params: dict[str, str], headers: dict[str, str], timeout: float, backend: str) -> bytes:
    """A bounded GET; errors name the backend and the status, never the request's headers."""
    try:
        client = httpx.Client(
            trust_env=False, timeout=timeout, follow_redirects=True, max_redirects=3, verify=tls_context()
        )
        with client, client.stream("GET", url, params=params, headers=headers) as response:
            if response.status_code >= 400:
                raise SearchFailed(f"{backend} answered HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes(65536):
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise SearchFailed(f"{backend}'s answer is larger than {MAX_ANSWER_BYTES} bytes")
            return bytes(body)
    except httpx.TimeoutException:
        raise SearchFailed(f"{backend} did not answer within {timeout:g}s", timeout=True) from None
    except httpx.HTTPError as exc:
        raise SearchFailed(f"{backend} could not be reached: {type(exc).__name__}") from None


def _decode(body: bytes, kind: type[T], backend: str) -> T:
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SearchFailed(f"{backend}'s answer is not the expected JSON: {str(exc)[:200]}") from None


def _run_bounded(argv: list[str], timeout: float) -> tuple[bytes, bytes, int]:
    """stdout (at most MAX_ANSWER_BYTES), stderr (the last 64 KiB) and the exit code;
    a command that runs too long or prints too much is killed."""
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise SearchFailed(f"the search command could not start: {exc.strerror}") from None
    with process:
        return _read_bounded(process, timeout)


def _read_bounded(process: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes, int]:
    assert process.stdout is not None and process.stderr is not None
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                process.kill()
                process.wait()
                raise SearchFailed(f"the search command did not finish within {timeout:g}s", timeout=True)
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                key.data.extend(data)
                if len(out) > MAX_ANSWER_BYTES:
                    process.kill()
                    process.wait()
                    raise SearchFailed(f"the search command printed more than {MAX_ANSWER_BYTES} bytes")
                del err[:-65536]
    return bytes(out), bytes(err), process.wait()
