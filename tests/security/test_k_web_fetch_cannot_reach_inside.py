"""K. web_fetch cannot be turned against the machine or its network (server-side request forgery).

The daemon below runs everything unasked (preset "all") and lets the test servers' ports
through, so only the address rules stand between a call and the servers: every spelling
of a loopback, private, link-local or otherwise internal address must be refused before
a single byte reaches a server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Server, serving
from toold_daemon.web import fetch as web
from toold_daemon.web.addresses import Reach


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, site: Server) -> Iterator[DaemonProcess]:
    config = f"""
[tools.web]
allowed_ports = [{site.port}]
[tools.approval]
preset = "all"
"""
    with module_daemon(tmp_path_factory, "ssrf", config) as d:
        yield d


def _forms(port: int) -> list[str]:
    return [
        f"http://127.0.0.1:{port}/",
        f"http://2130706433:{port}/",  # decimal
        f"http://0x7f.1:{port}/",  # hex, short form
        f"http://0x7f000001:{port}/",
        f"http://127.1:{port}/",  # short form
        f"http://017700000001:{port}/",  # octal
        f"http://127.0.0.1.:{port}/",  # trailing dot
        f"http://[::ffff:127.0.0.1]:{port}/",  # IPv4-mapped
        f"http://[::ffff:7f00:1]:{port}/",
        f"http://[64:ff9b::7f00:1]:{port}/",  # NAT64
        f"http://[2002:7f00:1::]:{port}/",  # 6to4
        f"http://[::127.0.0.1]:{port}/",  # IPv4-compatible
        f"http://[::1]:{port}/",
        f"http://localhost:{port}/",  # a name that resolves to loopback
        f"http://LOCALHOST.:{port}/",
        f"http://0.0.0.0:{port}/",
        f"http://0:{port}/",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",  # carrier-grade NAT
        "http://224.0.0.1/",  # multicast
        "http://255.255.255.255/",
        "http://[fd00::1]/",  # unique local
        "http://[fe80::1]/",  # link-local
        "http://[fe80::1%25eth0]/",  # with a zone
        "http://[ff02::1]/",
    ]


def test_every_spelling_of_an_internal_address_is_refused_before_a_byte_is_sent(
    daemon: DaemonProcess, site: Server
) -> None:
    before = len(site.requests)
    with daemon.client() as client:
        for url in _forms(site.port):
            result = client.call("web_fetch", {"url": url}, timeout=30)
            assert not result.ok and result.error is not None, url
            assert (result.error.type, result.error.code) == ("SandboxViolation", "URL_REFUSED"), (url, result.content)
    assert len(site.requests) == before


def test_dotted_forms_with_leading_zeros_are_not_urls(daemon: DaemonProcess, site: Server) -> None:
    """httpx refuses four-part octal forms outright (an invalid IPv4 address): BadArgs."""
    with daemon.client() as client:
        result = client.call("web_fetch", {"url": f"http://0177.0.0.01:{site.port}/"})
    assert result.error is not None and result.error.type == "BadArgs" and "IPv4" in result.error.message


def test_the_allowed_ports_hold_for_public_looking_hosts_too(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for url in ("http://example.com:22/", "https://example.com:8443/", "http://example.com:6379/"):
            result = client.call("web_fetch", {"url": url})
            assert result.error is not None and result.error.code == "URL_REFUSED" and "port" in result.error.message


def fetch_here(url: str, reach: Reach) -> web.Response:
    """The fetch the child runs, run in this process (so a test can change its resolver)."""
    return web.fetch(
        web.Request(url),
        reach,
        max_download_bytes=1 << 20,
        max_redirects=0,
        deadline=time.monotonic() + 10,
        cancelled=threading.Event(),
    )


def test_a_name_is_looked_up_once_and_the_checked_address_is_the_one_connected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: the first answer is allowed, any later one would not be. The fetch
    must connect to the first and never ask again."""
    with serving("127.0.0.1") as allowed, serving("127.0.0.2") as refused:
        assert allowed.port and refused.port
        answers = iter(["127.0.0.1", "127.0.0.2", "127.0.0.2"])
        lookups: list[str] = []
        real = socket.getaddrinfo

        def rebinding(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host != "rebind.test":
                return real(host, port, *args, **kwargs)
            lookups.append(host)
            return real(next(answers), port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        reach = Reach.of([allowed.port, refused.port], ["127.0.0.1/32"])
        # Both servers listen on the same port number only by chance; ask for the allowed one's.
        response = fetch_here(f"http://rebind.test:{allowed.port}/json", reach)
        assert response.status == 200 and lookups == ["rebind.test"]
        assert allowed.requests[-1].headers["host"] == f"rebind.test:{allowed.port}"  # the name, not the address
        assert refused.requests == []


def test_a_name_with_one_internal_answer_among_public_ones_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def mixed(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", mixed)
    with pytest.raises(web.FetchFailed) as caught:
        fetch_here("http://mixed.test/", Reach.of())
    assert caught.value.code == "URL_REFUSED" and "10.1.2.3" in caught.value.message


def test_a_redirect_from_https_to_http_is_refused() -> None:
    with pytest.raises(web.FetchFailed) as caught:
        web.refuse_downgrade(httpx.URL("https://a.example/"), httpx.URL("http://a.example/"))
    assert caught.value.code == "REDIRECT_REFUSED"
    web.refuse_downgrade(httpx.URL("http://a.example/"), httpx.URL("https://b.example/"))  # upgrading is fine


def test_no_proxy_from_the_environment(tmp_path_factory: pytest.TempPathFactory, site: Server) -> None:
    """An administrator may pass proxy variables to commands (the environment allowlist);
    web_fetch must still ignore them, or they would carry fetches around the rules (and
    answer for names this machine cannot resolve)."""
    proxy = {"HTTP_PROXY": site.url(""), "http_proxy": site.url(""), "ALL_PROXY": site.url("")}
    config = (
        '[tools.environment]\nallowlist = ["*_PROXY"]\n[tools.approval]\npreset = "all"\n'
        '[tools.network]\nmode = "host"\n'  # the administrator's variables, not the egress proxy's
    )
    before = len(site.requests)
    with module_daemon(tmp_path_factory, "ssrf-env-proxy", config, env=proxy) as d, d.client() as client:
        shell = client.call("shell", {"command": "env"})
        result = client.call("web_fetch", {"url": "http://unresolvable.invalid/json"})
    assert f"HTTP_PROXY={site.url('')}" in shell.content  # the variables do reach the children (host mode)
    assert result.error is not None and result.error.code == "DNS_FAILED", result.content
    assert len(site.requests) == before


def test_host_lists_refine_what_may_be_fetched(tmp_path_factory: pytest.TempPathFactory, site: Server) -> None:
    config = f"""
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}]
allowed_hosts = ["127.0.0.1", "*.example.com"]
denied_hosts = ["bad.example.com"]
[tools.approval]
preset = "all"
"""
    with module_daemon(tmp_path_factory, "ssrf-hosts", config) as d, d.client() as client:
        assert client.call("web_fetch", {"url": site.url("/json")}).ok
        for url, why in (
            ("http://bad.example.com/", "denied_hosts"),
            ("http://example.org/", "allowed_hosts"),
            (f"http://localhost:{site.port}/", "allowed_hosts"),
        ):
            result = client.call("web_fetch", {"url": url})
            assert result.error is not None and result.error.code == "URL_REFUSED" and why in result.error.message
