"""A real HTTP server on a loopback address for the web tools' tests.

Every request is recorded (method, path, headers, body), so a test can prove that a
refused URL never reached the server. Routes are plain functions of the request.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import brotli


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int = 200
    body: bytes | Iterator[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[Seen, dict[str, list[str]]], Reply]

PAGE = b"""<!doctype html><html><head><title>Cats &amp; Dogs</title>
<style>body { color: red }</style><script>var secret = "SCRIPT-TEXT";</script></head>
<body><nav><a href="/home">NAV-LINK</a></nav>
<main><h1>All about cats</h1>
<p>Cats are <b>small</b>   carnivores. See <a href="/more?x=1">more facts</a>.</p>
<ul><li>whiskers</li><li>tails</li></ul>
<table><tr><th>Name</th><th>Legs</th></tr><tr><td>cat</td><td>4</td></tr></table>
<div class="price">42 EUR</div><noscript>NOSCRIPT-TEXT</noscript>
</main><footer>FOOTER-TEXT</footer></body></html>"""


#: 60,000 nested elements around a script and some text: the HTML parser's time grows
#: with the square of the nesting (about 15 s for this page), so it is read as plain text.
_DEEP = (
    b"<html><head><title>Deep</title></head><body>"
    + b"<div><section>" * 30_000
    + b"<script>SCRIPT-TEXT</script>the bottom &amp; the end"
    + b"</section></div>" * 30_000
    + b"</body></html>"
)


def _big(query: dict[str, list[str]]) -> Reply:
    total = int(float(query.get("mb", ["50"])[0]) * 1024 * 1024)
    block = b"x" * 65536

    def chunks() -> Iterator[bytes]:
        sent = 0
        while sent < total:
            piece = block[: total - sent]
            sent += len(piece)
            yield piece

    return Reply(body=chunks(), headers={"Content-Type": "text/plain", "Content-Length": str(total)})


def _slow(query: dict[str, list[str]]) -> Reply:
    seconds = float(query.get("s", ["5"])[0])

    def chunks() -> Iterator[bytes]:
        yield b"first "
        time.sleep(seconds)
        yield b"late"

    return Reply(body=chunks(), headers={"Content-Type": "text/plain"})


def _echo(seen: Seen) -> Reply:
    answer = {"method": seen.method, "headers": seen.headers, "body": seen.body.decode("utf-8", "replace")}
    return Reply(body=json.dumps(answer).encode(), headers={"Content-Type": "application/json"})


def default_routes() -> dict[str, Route]:
    html = {"Content-Type": "text/html; charset=utf-8"}
    return {
        "/page": lambda s, q: Reply(body=PAGE, headers=html),
        "/json": lambda s, q: Reply(
            body=b'{"name":"toold","tags":["a","b"],"n":1}', headers={"Content-Type": "application/json"}
        ),
        "/latin1": lambda s, q: Reply(
            body="<p>caf\u00e9 na\u00efve</p>".encode("latin-1"),
            headers={"Content-Type": "text/html; charset=ISO-8859-1"},
        ),
        "/meta-charset": lambda s, q: Reply(
            body=b'<html><head><meta charset="windows-1251"></head><body><p>'
            + "\u041f\u0440\u0438\u0432\u0435\u0442".encode("cp1251")
            + b"</p></body></html>",
            headers={"Content-Type": "text/html"},
        ),
        "/unlabelled": lambda s, q: Reply(
            body="caf\u00e9 \u2013 d\u00e9j\u00e0 vu".encode("cp1252"), headers={"Content-Type": "text/plain"}
        ),
        "/gzip": lambda s, q: Reply(
            body=gzip.compress(b"<p>squeezed with gzip</p>"),
            headers={**html, "Content-Encoding": "gzip"},
        ),
        "/deflate": lambda s, q: Reply(
            body=zlib.compress(b"<p>squeezed with deflate</p>"),
            headers={**html, "Content-Encoding": "deflate"},
        ),
        "/br": lambda s, q: Reply(
            body=brotli.compress(b"<p>squeezed with brotli</p>"),
            headers={**html, "Content-Encoding": "br"},
        ),
        "/deep": lambda s, q: Reply(body=_DEEP, headers=html),
        "/png": lambda s, q: Reply(body=b"\x89PNG\r\n\x1a\n" + b"\0" * 3000, headers={"Content-Type": "image/png"}),
        "/missing": lambda s, q: Reply(
            status=404, body=b"<html><body><p>no such page here</p></body></html>", headers=html
        ),
        "/cookie": lambda s, q: Reply(
            body=b"<p>cookie set</p>", headers={**html, "Set-Cookie": "session=SECRET-COOKIE; Path=/"}
        ),
        "/echo": lambda s, q: _echo(s),
        "/big": lambda s, q: _big(q),
        "/slow": lambda s, q: _slow(q),
        "/redirect": lambda s, q: Reply(status=int(q.get("status", ["302"])[0]), headers={"Location": q["to"][0]}),
        "/loop": lambda s, q: Reply(status=302, headers={"Location": "/loop"}),
    }


class Server:
    def __init__(self, host: str, routes: dict[str, Route] | None = None) -> None:
        self.requests: list[Seen] = []
        self.routes = routes if routes is not None else default_routes()
        self._httpd = ThreadingHTTPServer((host, 0), _handler(self))
        self._httpd.daemon_threads = True
        self.host = host
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            server.requests.append(seen)
            parts = urlsplit(self.path)
            route = server.routes.get(parts.path)
            reply = route(seen, parse_qs(parts.query)) if route else Reply(404, b"not found")
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if isinstance(reply.body, bytes):
                if "Content-Length" not in reply.headers:
                    self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)
                return
            if "Content-Length" not in reply.headers:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                for chunk in reply.body:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        do_GET = do_POST = do_HEAD = _serve

    return Handler


@contextmanager
def serving(host: str = "127.0.0.1", routes: dict[str, Route] | None = None) -> Iterator[Server]:
    server = Server(host, routes)
    try:
        yield server
    finally:
        server.close()
