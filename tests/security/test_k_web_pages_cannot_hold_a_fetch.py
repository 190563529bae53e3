"""Attack: a web page nests its elements tens of thousands deep, so that the HTML parser,
whose time grows with the square of the depth, holds the fetch (and a core of the
client's worker) for seconds or minutes. Shapes the depth screen reads see plain text
at once; a page built to look shallow to it still ends at the call's own timeout, and the
daemon keeps serving."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Reply, Route, Server, serving
from toold_client import APPROVE_ALL

DEPTH = 60_000
_HTML = {"Content-Type": "text/html; charset=utf-8"}


def _page(opening: str, closing: str = "") -> bytes:
    return f"<html><body>{opening * DEPTH}bottom{closing * DEPTH}</body></html>".encode()


SHAPES = {
    "nested divs": _page("<div>", "</div>"),
    "upper case and self-closing syntax": _page("<DIV/>"),
    "formatting elements never closed": _page("<b><i>"),
    "end tags nothing opened, in between": _page("<div></span></section>"),
    "end tags in comments": _page("<div><!--</div>-->"),
    "end tags in scripts and styles": _page("<div><script></div></script ><style></div></style>"),
}


def _route(body: bytes) -> Route:
    return lambda seen, query: Reply(body=body, headers=_HTML)


@pytest.fixture(scope="module")
def site() -> Iterator[Server]:
    routes = {f"/{n}": _route(body) for n, body in enumerate(SHAPES.values())}
    # End tags inside attribute values: the screen counts them, the parser does not.
    routes["/hidden"] = _route(_page('<div title="</div>">'))
    routes["/small"] = _route(b"<html><body><p>fine</p></body></html>")
    with serving("127.0.0.1", routes) as server:
        yield server


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, site: Server) -> Iterator[DaemonProcess]:
    config = f"""
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}]
trusted_hosts = ["127.0.0.1"]
"""
    with module_daemon(tmp_path_factory, "deep-pages", config) as d:
        (d.root / "note.txt").write_text("still here\n")
        yield d


@pytest.mark.parametrize("number", range(len(SHAPES)), ids=list(SHAPES))
def test_a_deep_page_the_screen_reads_is_plain_text_at_once(daemon: DaemonProcess, site: Server, number: int) -> None:
    started = time.monotonic()
    with daemon.client() as client:
        result = client.call("web_fetch", {"url": site.url(f"/{number}")}, on_confirm=lambda r: APPROVE_ALL, timeout=60)
    assert result.ok, result.content
    assert time.monotonic() - started < 5  # the parser alone takes 15 s and more on these
    assert result.content.startswith("[elements nested more than 2048 deep")
    assert result.content.endswith("bottom")


def test_a_page_built_to_look_shallow_ends_at_the_calls_timeout(daemon: DaemonProcess, site: Server) -> None:
    started = time.monotonic()
    with daemon.client() as client:
        result = client.call(
            "web_fetch",
            {"url": site.url("/hidden"), "timeout_seconds": 2},
            on_confirm=lambda r: APPROVE_ALL,
            timeout=60,
        )
        waited = time.monotonic() - started
        assert client.call("read_file", {"path": "note.txt"}).ok  # the daemon serves on
        small = client.call("web_fetch", {"url": site.url("/small")}, on_confirm=lambda r: APPROVE_ALL, timeout=30)
    assert waited < 8, waited  # its timeout (2 s) and the second the runner allows on top
    assert not result.ok and result.error is not None and result.error.type == "Timeout", result.content
    assert small.ok and small.content == "fine"
