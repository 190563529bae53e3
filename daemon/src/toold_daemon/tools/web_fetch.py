"""web_fetch: fetch a URL and return what a model wants to read, never reaching inside.

Runs in a fresh confined child as the client, with the network open for that call only.
What it may reach is decided in ``web.addresses`` (by the URL's text, before anyone is
asked) and ``web.connect`` (by every resolved address, when connecting).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import SplitResult, parse_qsl, urlsplit

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..config import Config, WebConfig
from ..errors import ToolError, bad_args, sandbox_violation
from ..output import NOTHING_UNSEEN, Truncation, Unseen, truncate
from ..web.addresses import Reach, Refused, check_target, host_matches, normal_host
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import WebFetchData

if TYPE_CHECKING:
    import httpx

    from ..web.fetch import FetchFailed, Response

MAX_TIMEOUT_S = 300.0
# Headers a call may not set: they belong to the connection or to the client.
FORBIDDEN_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
     "proxy-authorization", "proxy-connection", "expect"}
)  # fmt: skip
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
_SECRET_NAME = re.compile(r"(?i)(key|token|secret|pass|auth|sig|session|cred|code|jwt|bearer)")
_SECRET_VALUE = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_\-+/=.]{20,}$")


#: A cut that would keep less text than this (or a quarter of the limit) drops its marker.
_KEPT_MIN_CHARS = 20


class WebFetchArgs(ToolArgs, frozen=True):
    """Fetch a web page or API response."""

    url: Annotated[str, Meta(min_length=1, max_length=8192, description="An http:// or https:// URL")]
    selector: (
        Annotated[str, Meta(max_length=1000, description="CSS selector: only the matching elements' text (HTML)")]
        | None
    ) = None
    max_length: (
        Annotated[int, Meta(ge=1, le=1_000_000, description="At most this many characters of content")] | None
    ) = None
    method: Annotated[Literal["GET", "POST", "HEAD"], Meta(description="HTTP method")] = "GET"
    headers: Annotated[dict[str, str], Meta(max_length=50, description="Request headers")] = {}  # noqa: RUF012 (frozen)
    body: Annotated[str, Meta(description="Request body (POST only)")] | None = None
    timeout_seconds: (
        Annotated[float, Meta(gt=0, le=MAX_TIMEOUT_S, description="Give up after this many seconds")] | None
    ) = None


class WebFetch(Tool[WebFetchArgs]):
    name = "web_fetch"
    description = (
        "Fetch a URL (http or https) and return its content as readable text: HTML reduced to title, "
        "headings, paragraphs, lists, tables and links as 'text (url)'; JSON pretty-printed; binary "
        "types described, not shown. Use selector (CSS) to keep only part of a page. Private and "
        "local network addresses are refused."
    )
    args_type = WebFetchArgs
    side_effecting = True  # it sends data out of the machine; a POST must not run twice after a crash
    risk = "medium"
    timeout_kind = "default"
    network = True
    data_type = WebFetchData
    output = (
        "data: {status, url (after redirects), content_type, headers (no Set-Cookie), truncated, bytes, "
        "redirects, matches (with selector)}; an HTTP status >= 400 is an HTTP_STATUS error carrying the body"
    )

    def warm(self) -> None:
        from ..web.fetch import warm_up

        warm_up()

    def warm_planning(self) -> None:
        import httpx  # noqa: F401 (URLs are parsed as the fetch will parse them)

    def validate(self, args: WebFetchArgs) -> None:
        if args.body is not None and args.method != "POST":
            raise bad_args(f"body is only sent with POST, not {args.method}")
        for name, value in args.headers.items():
            if not _HEADER_NAME.match(name):
                raise bad_args(f"not a header name: {name[:100]!r}")
            if name.lower() in FORBIDDEN_HEADERS:
                raise bad_args(f"the {name} header is set by toold, not by the call")
            if any(c in value for c in "\r\n\0") or len(value) > 8192:
                raise bad_args(f"the value of {name} has a line break, a NUL or more than 8192 characters")
        parts = _split(args.url)
        if parts.scheme not in ("http", "https"):
            raise sandbox_violation(
                "URL_REFUSED", f"only http and https URLs are fetched, not {parts.scheme or 'this'}"
            )

    def precheck(self, args: WebFetchArgs, resolved: dict[str, Path], config: Config) -> None:
        """Refuse by the URL's text before anyone is asked (addresses are checked when connecting)."""
        url = _parse(args.url)
        if url.userinfo:
            raise sandbox_violation("URL_REFUSED", "URLs with a user name or password are not fetched")
        try:
            check_target(url.scheme, url.host, url.port, reach_of(config.tools.web))
        except Refused as exc:
            raise sandbox_violation("URL_REFUSED", f"{url.host or args.url[:200]}: {exc}") from None

    def summary(self, args: WebFetchArgs) -> str:
        shown = f"{args.method} {shown_url(args.url)}"
        if len(shown) > 130:  # room for the body's start: at most 200 characters in all
            shown = shown[:129] + "…"
        if args.body is not None:
            shown += f" with a {len(args.body.encode())}-byte body: {_redacted_body(args.body)}"
        return shown

    def locations(self, args: WebFetchArgs) -> list[str]:
        return [shown_url(args.url)]

    def risk_for(self, args: WebFetchArgs) -> Literal["low", "medium", "high"]:
        return "high" if args.method == "POST" else "medium"

    def high_risk(self, args: WebFetchArgs) -> bool:
        return args.method == "POST"  # a POST asks unless a rule or the allowlist lets it run

    def prompts(self, args: WebFetchArgs, resolved: dict[str, Path], config: Config) -> bool:
        if args.method not in ("GET", "HEAD") or not config.tools.web.trusted_hosts:
            return True
        return not host_matches(_host(args.url), reach_of(config.tools.web).trusted_hosts)

    def grant_scope(self, args: WebFetchArgs) -> str | None:
        """ "Allow for this session" covers the host (scheme and port included), for reads
        or for POSTs: approving a GET never lets a POST run unasked."""
        url = _parse(args.url)
        kind = "POST" if args.method == "POST" else "GET"
        try:
            host = normal_host(url.host)
        except Refused:  # no host name: refused when it is checked (a grant names it as it came)
            host = url.host
        return f"web_fetch:{kind}:{url.scheme}://{host}:{url.port or ''}"

    def timeout_seconds(self, args: WebFetchArgs) -> float | None:
        # A little longer than the fetch's own deadline, so that the tool says what timed out.
        return args.timeout_seconds + 1.0 if args.timeout_seconds else None

    def run(self, args: WebFetchArgs, ctx: ToolContext) -> ToolOutput:
        # The HTTP stack is imported where fetches run (a worker, warmed in the spawner),
        # not in the protocol process, which only plans calls.
        from ..web.fetch import FetchFailed, Request, fetch

        web = ctx.config.tools.web
        budget = args.timeout_seconds or ctx.config.tools.timeouts.default_seconds
        deadline = time.monotonic() + max(0.1, budget - (0 if args.timeout_seconds else min(1.0, budget / 10)))
        try:
            response = fetch(
                Request(args.url, args.method, dict(args.headers), args.body),
                reach_of(web),
                max_download_bytes=web.max_download_bytes,
                max_redirects=web.max_redirects,
                deadline=deadline,
                cancelled=ctx.cancelled,
                proxy=web.proxy,
            )
        except FetchFailed as exc:
            raise _error_of(exc, args.method) from None
        content, matches = _content(response, args)
        limit = args.max_length or web.max_length
        # A download cut at max_download_bytes left at least this much unread.
        unread = max(1, (response.declared or response.size) - len(response.body))
        unseen = Unseen(unread, 0, exact=False) if response.cut and response.kind != "binary" else NOTHING_UNSEEN
        cut = truncate(content, max_chars=limit, unseen=unseen)
        if cut.truncated and _kept(cut.text, content) < min(limit // 4, _KEPT_MIN_CHARS):
            # The marker would fill (nearly) all of so short a limit: the text itself, cut
            # plainly (``truncated`` says so)
            cut = Truncation(content[:limit], True)
        data = {
            "status": response.status,
            "url": response.url,
            "content_type": response.content_type,
            "headers": response.headers,
            "truncated": cut.truncated,
            "bytes": response.size,
            "redirects": response.redirects,
        }
        if args.selector:
            data["matches"] = matches
        if response.status >= 400:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "HTTP_STATUS",
                f"{args.method} {shown_url(response.url)} answered HTTP {response.status}",
                status=response.status,
                url=response.url,
                output=cut.text,
            )
        return ToolOutput(cut.text, data=data)


def _kept(cut: str, content: str) -> int:
    """How much of ``content`` a cut still shows."""
    return next((i for i, (a, b) in enumerate(zip(cut, content, strict=False)) if a != b), min(len(cut), len(content)))


def reach_of(web: WebConfig) -> Reach:
    return Reach.of(web.allowed_ports, web.allowed_networks, web.denied_hosts, web.allowed_hosts, web.trusted_hosts)


def _content(response: Response, args: WebFetchArgs) -> tuple[str, int]:
    """The text a model reads, and how many elements the selector matched."""
    from ..web.pages import SelectorError, decode, html_text, media_type, pretty_json

    media = media_type(response.content_type) or "unknown type"
    if args.method == "HEAD":
        length = f", {response.declared:,} bytes" if response.declared is not None else ""
        return f"HTTP {response.status}, {media}{length}", 0
    if response.kind == "binary":
        size = f"{'at least ' if response.cut else ''}{response.size:,} bytes"
        return f"[binary content not shown: {media}, {size}]", 0
    text = decode(response.body, response.content_type, response.kind)
    if response.kind == "html":
        try:
            return html_text(text, response.url, args.selector)
        except SelectorError as exc:
            raise bad_args(str(exc)) from None
    if response.kind == "json" and not response.cut:
        text = pretty_json(text)
    return text, 1


def _error_of(failure: FetchFailed, method: str) -> ToolError:
    """The call's error: the request (method and URL, credentials hidden), why it failed,
    and details a program can use (kind, url, host, port)."""
    where = f"{method} {shown_url(failure.url)}: " if failure.url else ""
    details: dict[str, Any] = {"kind": failure.code.lower()}
    if failure.url:
        details |= {"url": shown_url(failure.url), "host": failure.host, "port": failure.port}
    if failure.timeout:
        return ToolError(ToolErrorType.TIMEOUT, "TIMEOUT", f"web_fetch timed out: {where}{failure.message}", **details)
    if failure.code == "URL_REFUSED":
        return sandbox_violation("URL_REFUSED", where + failure.message, **details)
    if failure.code == "BAD_URL":
        return bad_args(where + failure.message, **details)
    return ToolError(ToolErrorType.EXECUTION_FAILED, failure.code, where + failure.message, **details)


def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url.strip())
    except ValueError as exc:
        raise bad_args(f"not a URL: {exc}") from None


def _parse(url: str) -> httpx.URL:
    import httpx  # parsing as the fetch will: imported at the first web_fetch call planned

    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise bad_args(f"not a URL: {exc}") from None


def _host(url: str) -> str:
    import httpx

    try:
        return normal_host(httpx.URL(url).host)
    except (httpx.InvalidURL, TypeError, ValueError, Refused):
        return ""


def shown_url(url: str) -> str:
    """scheme://host/path?query for a person, with query values that look like
    credentials replaced by ``***`` (by their name, or by looking like a key)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url[:200]
    query = "&".join(
        f"{name}={'***' if _SECRET_NAME.search(name) or _SECRET_VALUE.match(value) else value}" if value else name
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else "" if not _bad_port(parts) else ":?"
    return f"{parts.scheme}://{host}{port}{parts.path or '/'}" + (f"?{query}" if query else "")


def _bad_port(parts: SplitResult) -> bool:
    try:
        _ = parts.port
    except ValueError:
        return True
    return False


def _redacted_body(body: str) -> str:
    """The start of a body, with values that look like credentials hidden."""
    shown = re.sub(
        r"""(?i)(["']?\w*(?:key|token|secret|pass\w*|auth\w*|session|cred\w*)["']?\s*[:=]\s*["']?)([^"'&,\s}]+)""",
        r"\1***",
        body[:400],
    )
    shown = re.sub(r"[A-Za-z0-9_\-+/=.]{20,}", lambda m: "***" if _SECRET_VALUE.match(m.group()) else m.group(), shown)
    return shown[:40] + ("…" if len(shown) > 40 or len(body) > 400 else "")
