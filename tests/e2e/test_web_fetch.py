"""web_fetch end to end: a real daemon fetching from real HTTP servers on 127.0.0.1/127.0.0.2."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

import toold_protocol as p
from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Server, serving
from toold_client import APPROVE_ALL, Decision


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Server]:
    """The "other network" of redirect tests: 127.0.0.2, not exempted anywhere."""
    with serving("127.0.0.2") as server:
        yield server


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLOSED_PORT = _closed_port()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, site: Server, elsewhere: Server) -> Iterator[DaemonProcess]:
    """127.0.0.1 exempted and trusted (GETs run unasked); 127.0.0.2 left refused."""
    config = f"""
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}, {elsewhere.port}, {CLOSED_PORT}]
trusted_hosts = ["127.0.0.1"]
[tools.approval]
timeout_seconds = 20
"""
    with module_daemon(tmp_path_factory, "web", config) as d:
        yield d


def fetch(d: DaemonProcess, **arguments: Any) -> p.ToolResult:
    with d.client() as client:
        return client.call("web_fetch", arguments, on_confirm=lambda r: APPROVE_ALL, timeout=60)


def test_html_becomes_readable_text_without_scripts_styles_or_chrome(daemon: DaemonProcess, site: Server) -> None:
    result = fetch(daemon, url=site.url("/page"))
    assert result.ok, result.content
    text = result.content
    assert text.startswith("Title: Cats & Dogs")
    assert "# All about cats" in text
    assert "Cats are small carnivores." in text  # whitespace collapsed, inline markup gone
    assert f"more facts ({site.url('/more?x=1')})" in text  # links as text (absolute url)
    assert "- whiskers\n- tails" in text
    assert "Name | Legs\ncat | 4" in text
    for hidden in ("SCRIPT-TEXT", "color: red", "NOSCRIPT-TEXT", "NAV-LINK", "FOOTER-TEXT"):
        assert hidden not in text
    assert result.data is not None
    assert result.data["status"] == 200 and result.data["url"] == site.url("/page")
    assert result.data["content_type"].startswith("text/html") and result.data["truncated"] is False


def test_a_selector_keeps_only_the_matching_elements(daemon: DaemonProcess, site: Server) -> None:
    result = fetch(daemon, url=site.url("/page"), selector="div.price")
    assert result.ok and result.content == "42 EUR" and result.data is not None and result.data["matches"] == 1
    none = fetch(daemon, url=site.url("/page"), selector="div.nothing")
    assert none.ok and none.content == "" and none.data is not None and none.data["matches"] == 0
    bad = fetch(daemon, url=site.url("/page"), selector="p[")
    assert not bad.ok and bad.error is not None and bad.error.type == "BadArgs"


def test_a_page_nested_beyond_reason_is_read_as_plain_text_in_a_moment(daemon: DaemonProcess, site: Server) -> None:
    started = time.monotonic()
    result = fetch(daemon, url=site.url("/deep"))
    assert result.ok, result.content
    assert time.monotonic() - started < 5  # the parser alone took about 15 s of CPU on it
    assert result.content.startswith("[elements nested more than 2048 deep: the page's plain text]")
    assert result.content.endswith("]\n\nthe bottom & the end") and "SCRIPT-TEXT" not in result.content
    selected = fetch(daemon, url=site.url("/deep"), selector="div")
    assert not selected.ok and selected.error is not None and selected.error.type == "BadArgs"
    assert "too deep to select from" in selected.content


def test_max_length_cuts_the_content_with_the_marker_inside_the_limit(daemon: DaemonProcess, site: Server) -> None:
    result = fetch(daemon, url=site.url("/page"), max_length=80)
    assert result.ok and len(result.content) <= 80
    assert "[output truncated:" in result.content and result.data is not None and result.data["truncated"] is True


def test_a_50_mb_body_costs_the_download_cap_and_not_the_daemons_memory(daemon: DaemonProcess, site: Server) -> None:
    process = psutil.Process(daemon.proc.pid)
    fetch(daemon, url=site.url("/json"))  # warm: the first fetch's one-time costs are not the body's
    before = process.memory_info().rss
    result = fetch(daemon, url=site.url("/big?mb=50"))
    grown = process.memory_info().rss - before
    assert result.ok and result.data is not None
    assert result.data["truncated"] is True
    assert 5 * 1024 * 1024 <= result.data["bytes"] <= 5 * 1024 * 1024 + 65536  # stopped at max_download_bytes
    assert "[output truncated: at least" in result.content and len(result.content) <= 50_000  # default max_length
    assert grown < 32 * 1024 * 1024, f"the daemon grew by {grown} bytes"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/latin1", "café naïve"),  # the header's charset
        ("/meta-charset", "Привет"),  # <meta charset> when the header names none
        ("/unlabelled", "café – déjà vu"),  # not UTF-8, no label: Windows-1252
        ("/gzip", "squeezed with gzip"),
        ("/deflate", "squeezed with deflate"),
        ("/br", "squeezed with brotli"),
    ],
)
def test_charsets_and_content_encodings(daemon: DaemonProcess, site: Server, path: str, expected: str) -> None:
    result = fetch(daemon, url=site.url(path))
    assert result.ok and result.content == expected


def test_json_is_pretty_printed_and_binary_is_described_never_dumped(daemon: DaemonProcess, site: Server) -> None:
    data = fetch(daemon, url=site.url("/json"))
    assert data.ok and data.content == '{\n  "name": "toold",\n  "tags": [\n    "a",\n    "b"\n  ],\n  "n": 1\n}'
    image = fetch(daemon, url=site.url("/png"))
    assert image.ok and image.content == "[binary content not shown: image/png, 3,008 bytes]"
    head = fetch(daemon, url=site.url("/page"), method="HEAD")
    assert head.ok and head.content.startswith("HTTP 200, text/html, ")


def test_an_http_error_status_is_an_error_result_that_keeps_the_body(daemon: DaemonProcess, site: Server) -> None:
    result = fetch(daemon, url=site.url("/missing"))
    assert not result.ok and result.error is not None
    error = result.error
    assert (error.type, error.code, error.details["status"]) == ("ExecutionFailed", "HTTP_STATUS", 404)
    assert "no such page here" in result.content


def test_a_slow_server_is_a_timeout(daemon: DaemonProcess, site: Server) -> None:
    started = time.monotonic()
    result = fetch(daemon, url=site.url("/slow?s=6"), timeout_seconds=1)
    assert not result.ok and result.error is not None and result.error.type == "Timeout"
    assert time.monotonic() - started < 4


def test_post_sends_body_and_headers_and_no_cookie_survives_a_call(daemon: DaemonProcess, site: Server) -> None:
    cookie = fetch(daemon, url=site.url("/cookie"))
    assert cookie.ok and cookie.data is not None
    assert "set-cookie" not in {k.lower() for k in cookie.data["headers"]}
    result = fetch(daemon, url=site.url("/echo"), method="POST", body='{"q": 1}', headers={"X-Test": "yes"})
    assert result.ok, result.content
    assert '"body": "{\\"q\\": 1}"' in result.content and '"x-test": "yes"' in result.content
    assert '"user-agent": "toold-web-fetch/' in result.content
    assert "SECRET-COOKIE" not in result.content  # the cookie of the earlier call was not kept


def test_network_failures_each_have_their_own_code(daemon: DaemonProcess, site: Server) -> None:
    dns = fetch(daemon, url=f"http://no-such-host.invalid:{site.port}/")
    assert dns.error is not None and dns.error.code == "DNS_FAILED", dns.content
    refused = fetch(daemon, url=f"http://127.0.0.1:{CLOSED_PORT}/")
    assert refused.error is not None and refused.error.code == "CONNECTION_REFUSED", refused.content
    tls = fetch(daemon, url=f"https://127.0.0.1:{site.port}/page")  # a plain-HTTP server answering TLS
    assert tls.error is not None and tls.error.code == "TLS_FAILED", tls.content


def test_redirects_are_followed_and_each_hop_is_checked(daemon: DaemonProcess, site: Server, elsewhere: Server) -> None:
    followed = fetch(daemon, url=site.url(f"/redirect?to={site.url('/json')}"))
    assert followed.ok and followed.data is not None and followed.data["redirects"] == [site.url("/json")]
    assert followed.data["url"] == site.url("/json")
    before = len(elsewhere.requests)
    refused = fetch(daemon, url=site.url(f"/redirect?to={elsewhere.url('/page')}"))
    assert refused.error is not None and refused.error.code == "URL_REFUSED", refused.content
    assert "127.0.0.2" in refused.error.message
    assert len(elsewhere.requests) == before  # the refused network never saw a request
    port = fetch(daemon, url=site.url("/redirect?to=http://127.0.0.1:8081/"))
    assert port.error is not None and port.error.code == "URL_REFUSED" and "port 8081" in port.error.message
    scheme = fetch(daemon, url=site.url("/redirect?to=file:///etc/passwd"))
    assert scheme.error is not None and scheme.error.code in ("URL_REFUSED", "NETWORK_ERROR"), scheme.content
    loop = fetch(daemon, url=site.url("/loop"))
    assert loop.error is not None and loop.error.code == "TOO_MANY_REDIRECTS"


def test_only_reads_of_trusted_hosts_run_unasked(daemon: DaemonProcess, site: Server) -> None:
    with daemon.client() as client:
        assert client.explain("web_fetch", {"url": site.url("/page")}).decision == "allow"
        assert client.explain("web_fetch", {"url": site.url("/page"), "method": "HEAD"}).decision == "allow"
        assert client.explain("web_fetch", {"url": site.url("/echo"), "method": "POST"}).decision == "ask"
        other = f"http://localhost:{site.port}/page"
        assert client.explain("web_fetch", {"url": other}).decision == "ask"


def test_remember_grants_that_host_for_reads_and_never_posts(daemon: DaemonProcess, site: Server) -> None:
    asked: list[p.ConfirmationRequested] = []

    def remember(request: p.ConfirmationRequested) -> Decision:
        asked.append(request)
        return Decision("approve_all", remember_for_session=True)

    localhost = f"http://localhost:{site.port}"
    with daemon.client() as client:
        first = client.call("web_fetch", {"url": f"{localhost}/json"}, on_confirm=remember, timeout=30)
        assert first.ok and len(asked) == 1
        again = client.call("web_fetch", {"url": f"{localhost}/page?x=2"}, on_confirm=remember, timeout=30)
        assert again.ok and len(asked) == 1  # the host is granted for this session
        post = client.call("web_fetch", {"url": f"{localhost}/echo", "method": "POST"}, on_confirm=remember)
        assert post.ok and len(asked) == 2  # a read's grant never covers a POST
    with daemon.client() as fresh:  # another session asks again
        assert fresh.explain("web_fetch", {"url": f"{localhost}/json"}).decision == "ask"


def test_the_confirmation_shows_method_host_and_path_with_secrets_redacted(daemon: DaemonProcess, site: Server) -> None:
    asked: list[p.ConfirmationRequested] = []

    def deny(request: p.ConfirmationRequested) -> Decision:
        asked.append(request)
        return Decision("deny_all")

    secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    url = site.url(f"/echo?q=cats&access_token={secret}&other={secret}")
    with daemon.client() as client:
        result = client.call(
            "web_fetch", {"url": url, "method": "POST", "body": f'{{"api_key": "{secret}", "n": 1}}'}, on_confirm=deny
        )
    assert not result.ok and len(asked) == 1
    summary = asked[0].calls[0].summary
    assert summary.startswith(f"POST http://127.0.0.1:{site.port}/echo?q=cats&access_token=***")
    assert secret not in summary and "api_key" in summary


def test_rules_can_match_the_url(tmp_path_factory: pytest.TempPathFactory, site: Server) -> None:
    config = f"""
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}]
[[tools.approval.rules]]
tool = "web_fetch"
decision = "allow"
conditions = [{{ param = "url", operator = "startsWith", value = "http://127.0.0.1:{site.port}/echo" }}]
[[tools.approval.rules]]
tool = "web_fetch"
decision = "deny"
conditions = [{{ param = "url", operator = "contains", value = "/page" }}]
"""
    with module_daemon(tmp_path_factory, "web-rules", config) as d, d.client() as client:
        assert client.explain("web_fetch", {"url": site.url("/echo"), "method": "POST"}).decision == "allow"
        assert client.explain("web_fetch", {"url": site.url("/page")}).decision == "deny"
        assert client.explain("web_fetch", {"url": site.url("/json")}).decision == "ask"


def test_in_auto_mode_reads_run_and_posts_still_ask(tmp_path_factory: pytest.TempPathFactory, site: Server) -> None:
    config = '[tools.approval]\nmode = "auto"\n'
    with module_daemon(tmp_path_factory, "web-auto", config) as d, d.client() as client:
        assert client.explain("web_fetch", {"url": "https://example.com/"}).decision == "allow"
        assert client.explain("web_fetch", {"url": "https://example.com/", "method": "POST"}).decision == "ask"


def test_a_configured_proxy_carries_every_fetch_and_the_rules_still_hold(
    tmp_path_factory: pytest.TempPathFactory, elsewhere: Server
) -> None:
    """The proxy (here the 127.0.0.2 server, which answers absolute-form requests) is the
    administrator's: reached although it is a loopback address; the targets are still checked."""
    config = f"""
[tools.web]
proxy = "http://127.0.0.2:{elsewhere.port}"
[tools.approval]
preset = "all"
"""
    with module_daemon(tmp_path_factory, "web-proxy", config) as d, d.client() as client:
        result = client.call("web_fetch", {"url": "http://unresolvable.invalid/json"})
        assert result.ok, result.content
        assert elsewhere.requests[-1].path == "http://unresolvable.invalid/json"  # absolute form: a proxy request
        before = len(elsewhere.requests)
        for url in ("http://10.0.0.1/", "http://localhost/json", "http://127.0.0.2/"):
            refused = client.call("web_fetch", {"url": url})
            assert refused.error is not None and refused.error.code == "URL_REFUSED", (url, refused.content)
        assert len(elsewhere.requests) == before


def test_bad_arguments_are_refused_before_anything_is_sent(daemon: DaemonProcess, site: Server) -> None:
    before = len(site.requests)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"url": site.url("/echo"), "body": "x"}, "BadArgs"),  # a body without POST
        ({"url": site.url("/echo"), "headers": {"Host": "evil"}}, "BadArgs"),
        ({"url": site.url("/echo"), "headers": {"X-A": "1\r\nX-B: 2"}}, "BadArgs"),
        ({"url": site.url("/echo"), "method": "DELETE"}, "BadArgs"),
        ({"url": "ftp://127.0.0.1/x"}, "SandboxViolation"),
        ({"url": f"http://user:pw@127.0.0.1:{site.port}/echo"}, "SandboxViolation"),
        ({"url": "not a url at all"}, "SandboxViolation"),
    ]
    for arguments, kind in cases:
        result = fetch(daemon, **arguments)
        assert not result.ok and result.error is not None and result.error.type == kind, (arguments, result.content)
    assert len(site.requests) == before


def test_the_http_stack_is_warmed_in_the_spawner_and_never_loaded_by_the_protocol_process(
    daemon: DaemonProcess,
) -> None:
    """The spawner builds web_fetch's stack once it has answered the start's probe, so that
    every child forked after inherits it; the protocol process, which only plans calls,
    never loads it (its shared libraries show in a process's memory map)."""
    protocol = psutil.Process(daemon.proc.pid)
    spawner = next(child for child in protocol.children() if "serve" in " ".join(child.cmdline()))

    def loads_the_html_parser(process: psutil.Process) -> bool:
        return any("selectolax" in region.path for region in process.memory_maps())

    deadline = time.monotonic() + 10
    while not loads_the_html_parser(spawner):
        assert time.monotonic() < deadline, "the spawner never warmed web_fetch"
        time.sleep(0.05)
    assert not loads_the_html_parser(protocol)
