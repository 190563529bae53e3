"""One web request, redirects followed by hand so that every hop is checked again.

Runs in the call's isolated child (the network is open there for this call only). A
fresh client per call: no cookies or connections kept between calls, no proxy from the
environment, a fixed ``User-Agent``. The body streams into a buffer that stops at
``max_download_bytes``: a 10 GB response costs that much and no more.
"""

from __future__ import annotations

# Python's socket module encodes every host name with this codec, imported on first use:
# imported here, in the spawner, every fetch's child inherits it (it cost each one an import
# of it and ``stringprep``, about 1.5 ms).
import encodings.idna  # noqa: F401
import ssl
import threading
import time
from functools import cache

import certifi
import httpcore
import httpx
import msgspec

from .addresses import DEFAULT_PORTS, Reach, Refused, check_target
from .connect import CheckedBackend, NameNotResolved, checked_addresses
from .pages import Kind, kind_of

USER_AGENT = "toold-web-fetch/0.1 (+https://github.com/toold; an LLM tool daemon)"
_CHUNK = 64 * 1024


class FetchFailed(Exception):
    """``code`` is the error code the tool reports; ``timeout`` marks a Timeout."""

    def __init__(self, code: str, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.timeout = timeout
        #: The URL of the request that failed (a redirect's target, for a later hop), its
        #: host and port, when known: for the error's details.
        self.url = ""
        self.host = ""
        self.port = 0


class Request(msgspec.Struct, frozen=True):
    url: str
    method: str = "GET"
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    body: str | None = None


class Response(msgspec.Struct):
    status: int
    url: str
    content_type: str
    headers: dict[str, str]
    kind: Kind
    body: bytes  # empty for binary bodies: they are counted, not kept
    size: int  # bytes received (decoded), or the declared length of a binary body
    declared: int | None  # the Content-Length of an unencoded body
    cut: bool  # the body went past max_download_bytes and was cut there
    redirects: list[str]


@cache
def tls_context() -> ssl.SSLContext:
    """Built once: loading the CA bundle costs ~17 ms."""
    return ssl.create_default_context(cafile=certifi.where())


tls_context()  # at import, in the daemon before the spawner forks: every child inherits it


def fetch(
    request: Request,
    reach: Reach,
    *,
    max_download_bytes: int,
    max_redirects: int,
    deadline: float,
    cancelled: threading.Event,
    proxy: str = "",
) -> Response:
    """Follow at most ``max_redirects`` redirects, checking each hop; raises FetchFailed."""
    proxy_url = httpx.URL(proxy) if proxy else None
    url, method, body = _parse(request.url), request.method, request.body
    headers = {"user-agent": USER_AGENT, "accept-encoding": "gzip, deflate, br", **_lower(request.headers)}
    redirects: list[str] = []
    client = httpx.Client(transport=_transport(reach, proxy_url), trust_env=False, follow_redirects=False)
    with client:
        while True:
            url = _checked(url, reach, proxied=proxy_url is not None)
            timeout = _remaining(deadline)
            try:
                outgoing = client.build_request(method, url, headers=headers, content=body, timeout=timeout)
                response = client.send(outgoing, stream=True)
            except (httpx.HTTPError, Refused, NameNotResolved, ssl.SSLError, OSError) as exc:
                raise _failure(exc, url) from None
            try:
                if response.is_redirect and response.next_request is not None:
                    if len(redirects) >= max_redirects:
                        raise FetchFailed(
                            "TOO_MANY_REDIRECTS", f"more than {max_redirects} redirects ([tools.web] max_redirects)"
                        )
                    following = response.next_request
                    refuse_downgrade(url, following.url)
                    redirects.append(str(following.url))
                    if following.url.host != url.host or following.url.port != url.port:
                        headers = {k: v for k, v in headers.items() if k not in ("authorization", "cookie")}
                    if following.method != method:  # 303, or a POST answered with 301/302
                        body = None
                    url, method = following.url, following.method
                    continue
                return _read(response, max_download_bytes, deadline, cancelled, redirects)
            finally:
                response.close()


def warm_up() -> None:
    """One request and one page through the whole stack, in memory (no network): the
    patterns and tables httpx, h11 and selectolax build on first use are then built
    once in the spawner and inherited by every fetch (about 1.3 ms a call)."""
    from .pages import decode, html_text

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/html; charset=utf-8", "set-cookie": "a=b; Path=/"}
        return httpx.Response(200, headers=headers, content=b"<p>warm <a href='/x'>up</a></p>")

    with httpx.Client(transport=httpx.MockTransport(answer), trust_env=False) as client:
        response = client.get("http://warm.invalid/?q=1", headers={"user-agent": USER_AGENT})
        html_text(decode(response.content, response.headers["content-type"], "html"), str(response.url))


def refuse_downgrade(current: httpx.URL, following: httpx.URL) -> None:
    """A page fetched over TLS may not send the request on in the clear."""
    if current.scheme == "https" and following.scheme != "https":
        raise FetchFailed("REDIRECT_REFUSED", f"refused a redirect from https to {following.scheme}: {following}")


def _transport(reach: Reach, proxy: httpx.URL | None) -> httpx.HTTPTransport:
    """httpx's transport on a connection pool of our own, whose backend decides where it
    may connect (httpx has no parameter for the backend; httpcore's pool has)."""
    transport = httpx.HTTPTransport(verify=tls_context(), retries=0)
    pool: httpcore.ConnectionPool
    if proxy is None:
        pool = httpcore.ConnectionPool(
            ssl_context=tls_context(), network_backend=CheckedBackend(reach.allowed_networks), retries=0
        )
    else:
        exempt = [(proxy.host, proxy.port or DEFAULT_PORTS[proxy.scheme])]
        pool = httpcore.HTTPProxy(
            proxy_url=httpcore.URL(str(proxy)),
            ssl_context=tls_context(),
            network_backend=CheckedBackend(reach.allowed_networks, exempt),
        )
    transport._pool.close()
    transport._pool = pool
    return transport


def _parse(raw: str) -> httpx.URL:
    try:
        return httpx.URL(raw)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise FetchFailed("BAD_URL", f"not a URL: {exc}") from None


def _checked(url: httpx.URL, reach: Reach, *, proxied: bool) -> httpx.URL:
    """``url`` with its host in normal form, or FetchFailed. Through a proxy, which looks
    names up itself, the addresses are checked here instead of when connecting (a name
    this machine cannot resolve is left to the proxy)."""
    if url.userinfo:
        raise FetchFailed("URL_REFUSED", "URLs with a user name or password are not fetched (send a header instead)")
    try:
        host = check_target(url.scheme, url.host, url.port, reach)
        if proxied:
            checked_addresses(host, url.port or DEFAULT_PORTS[url.scheme], reach.allowed_networks)
    except Refused as exc:
        raise FetchFailed("URL_REFUSED", f"{url.host or url}: {exc}") from None
    except NameNotResolved as exc:
        if not proxied:
            raise FetchFailed("DNS_FAILED", str(exc)) from None
        # Behind a proxy this machine may resolve nothing: the proxy looks the name up.
    return url.copy_with(host=host) if host != url.host else url


def _read(
    response: httpx.Response, limit: int, deadline: float, cancelled: threading.Event, redirects: list[str]
) -> Response:
    content_type = response.headers.get("content-type", "")
    headers = {k: v for k, v in response.headers.items() if k.lower() != "set-cookie"}
    declared = _declared_length(response)
    buffer = bytearray()
    cut = False
    kind: Kind | None = None
    size = 0
    try:
        for chunk in response.iter_bytes(_CHUNK):
            if kind is None:
                kind = kind_of(content_type, chunk)
                if kind == "binary" and declared is not None:
                    size = declared
                    break  # described by its declared size: nothing more to read
            size += len(chunk)
            if kind != "binary":
                buffer += chunk[: max(0, limit - len(buffer))]
            if size > limit:
                cut = True
                break
            if cancelled.is_set():
                break
            if time.monotonic() > deadline:
                raise FetchFailed("TIMEOUT", "the response did not finish in time", timeout=True)
    except httpx.HTTPError as exc:
        raise _failure(exc, response.url) from None
    return Response(
        status=response.status_code,
        url=str(response.url),
        content_type=content_type,
        headers=headers,
        kind=kind or kind_of(content_type, b""),
        body=bytes(buffer),
        size=size,
        declared=declared,
        cut=cut,
        redirects=redirects,
    )


def _declared_length(response: httpx.Response) -> int | None:
    value = response.headers.get("content-length", "")
    return int(value) if value.isdigit() and "content-encoding" not in response.headers else None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchFailed("TIMEOUT", "no time left for the request", timeout=True)
    return left


def _lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _failure(exc: BaseException, url: httpx.URL) -> FetchFailed:
    """The error a call reports for an exception of the HTTP stack, by cause, with the URL,
    host and port it was about."""
    failure = _cause_of(exc, url)
    if not failure.url:
        failure.url, failure.host = str(url), url.host
        failure.port = url.port or DEFAULT_PORTS.get(url.scheme, 0)
    return failure


def _cause_of(exc: BaseException, url: httpx.URL) -> FetchFailed:
    host = url.host
    if isinstance(exc, FetchFailed):
        return exc
    if isinstance(exc, Refused):
        return FetchFailed("URL_REFUSED", str(exc))
    if isinstance(exc, NameNotResolved):
        return FetchFailed("DNS_FAILED", str(exc))
    if isinstance(exc, httpx.TimeoutException):
        return FetchFailed("TIMEOUT", f"{host} did not answer in time ({type(exc).__name__})", timeout=True)
    causes = _causes(exc)
    if any(isinstance(c, ssl.SSLError) for c in causes):
        reason = next(str(c) for c in causes if isinstance(c, ssl.SSLError))
        return FetchFailed("TLS_FAILED", f"TLS with {host} failed: {reason[:300]}")
    if any(isinstance(c, ConnectionRefusedError) for c in causes) or "refused" in str(exc).lower():
        return FetchFailed(
            "CONNECTION_REFUSED", f"{host}:{url.port or DEFAULT_PORTS.get(url.scheme, '')} refused the connection"
        )
    if isinstance(exc, httpx.DecodingError):
        return FetchFailed("DECODING_FAILED", f"the response from {host} could not be decoded: {exc}")
    if isinstance(exc, httpx.ConnectError):
        return FetchFailed("CONNECT_FAILED", f"could not connect to {host}: {exc}")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.LocalProtocolError):
        return FetchFailed("PROTOCOL_ERROR", f"{host} broke the HTTP protocol: {exc}")
    return FetchFailed("NETWORK_ERROR", f"the request to {host} failed: {type(exc).__name__}: {exc}"[:400])


def _causes(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(found) < 10:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
