"""The egress proxy against real clients (curl, raw sockets) and a real HTTP server.

The proxy runs in this process; destinations are a server on 127.0.0.1, which is
loopback and so refused unless ``allowed_networks`` exempts it."""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from tests.webserver import Server, serving
from toold_daemon.egress.proxy import Connection, Proxy
from toold_daemon.egress.relay import Budget
from toold_daemon.egress.rules import EgressRules

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


@pytest.fixture
def web() -> Iterator[Server]:
    with serving() as server:
        yield server


class Running:
    def __init__(self, port: int, records: list[Connection], asked: list[tuple[str, int]]) -> None:
        self.port, self.records, self.asked = port, records, asked


@asynccontextmanager
async def running(
    rules: EgressRules, networks: tuple[ipaddress.IPv4Network, ...] = LOOPBACK, budget: int = 1 << 40
) -> AsyncIterator[Running]:
    records: list[Connection] = []
    asked: list[tuple[str, int]] = []

    async def decide(host: str, port: int) -> tuple[bool, str]:
        judgement, why, _normal = rules.judge(host, port)
        if judgement == "ask":
            asked.append((host, port))
            return False, "asked, and the person said no"
        return judgement == "allow", why

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    served = Proxy(decide, records.append, networks, Budget(budget))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.serve, listeners[0])
        yield Running(port, records, asked)
        nursery.cancel_scope.cancel()


@pytest.fixture
async def proxy(web: Server) -> AsyncIterator[Running]:
    async with running(EgressRules.of(allowed_domains=["localhost"], allowed_ports=[80, 443, web.port])) as r:
        yield r


async def recorded(proxy: Running, count: int = 1) -> list[Connection]:
    """The proxy's records once ``count`` connections have finished (it records on close)."""
    with trio.fail_after(5):
        while len(proxy.records) < count:
            await trio.sleep(0.01)
    return proxy.records


async def exchange(port: int, *messages: bytes, reply_size: int = 65536) -> bytes:
    """Send each message over one connection to the proxy, reading after each; return the last reply."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    reply = b""
    async with stream:
        for message in messages:
            await stream.send_all(message)
            with trio.fail_after(5):
                reply = await stream.receive_some(reply_size)
    return reply


async def curl(*args: str) -> tuple[int, str]:
    done = await trio.run_process(
        ["curl", "-sS", "--max-time", "10", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


async def test_plain_http_through_the_proxy_reaches_an_allowed_host(proxy: Running, web: Server) -> None:
    code, out = await curl("-x", f"http://127.0.0.1:{proxy.port}", f"http://localhost:{web.port}/json")
    assert code == 0 and "toold" in out, out
    assert web.requests[-1].path == "/json"
    assert "proxy-connection" not in web.requests[-1].headers
    record = (await recorded(proxy))[-1]
    assert (record.host, record.protocol, record.refused) == ("localhost", "http", "")
    assert record.received > 0 and record.sent > 0 and "allowed_domains" in record.allowed_by


async def test_connect_and_socks5_reach_it_too(proxy: Running, web: Server) -> None:
    code, out = await curl("-p", "-x", f"http://127.0.0.1:{proxy.port}", f"http://localhost:{web.port}/json")
    assert code == 0 and "toold" in out, out
    assert (await recorded(proxy))[-1].protocol == "connect"
    code, out = await curl("--socks5-hostname", f"127.0.0.1:{proxy.port}", f"http://localhost:{web.port}/json")
    assert code == 0 and "toold" in out, out
    assert (await recorded(proxy, 2))[-1].protocol == "socks5"


@pytest.mark.parametrize(
    "target",
    ["http://example.invalid/", "http://127.0.0.1/", "http://0x7f.1/", "http://2130706433/", "http://[::1]/",
     "http://[::ffff:127.0.0.1]/", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/"],
)  # fmt: skip
async def test_refused_destinations_get_a_403_and_reach_nothing(web: Server, target: str) -> None:
    async with running(EgressRules.of(allowed_domains=["localhost"]), networks=()) as proxy:
        _code, out = await curl("-i", "-x", f"http://127.0.0.1:{proxy.port}", target)
    assert "403" in out, out
    assert not web.requests


async def test_an_allowed_name_that_resolves_to_loopback_is_refused(web: Server) -> None:
    """Attack: an allowed name whose address is private (DNS pointing at 127.0.0.1 or the
    metadata service). ``localhost`` is allowed by name and resolves to loopback."""
    async with running(EgressRules.of(allowed_domains=["localhost"]), networks=()) as proxy:
        _code, out = await curl("-i", "-x", f"http://127.0.0.1:{proxy.port}", "http://localhost/")
        assert "403" in out and "loopback" in out, out
        code, _out = await curl("-p", "-x", f"http://127.0.0.1:{proxy.port}", "https://localhost/")
        assert code != 0


async def test_a_socks_request_for_an_ip_literal_is_judged_like_a_name(proxy: Running, web: Server) -> None:
    """A private address by number is refused at once; a public one not allowed by name is asked."""
    request = b"\x05\x01\x00\x01" + socket.inet_aton("10.1.2.3") + struct.pack("!H", 80)
    assert (await exchange(proxy.port, b"\x05\x01\x00", request))[1] == 2  # not allowed by ruleset
    request = b"\x05\x01\x00\x01" + socket.inet_aton("93.184.216.34") + struct.pack("!H", 80)
    assert (await exchange(proxy.port, b"\x05\x01\x00", request))[1] == 2
    assert ("93.184.216.34", 80) in proxy.asked
    domain = b"\x05\x01\x00\x03" + bytes([9]) + b"localhost" + struct.pack("!H", web.port)
    assert (await exchange(proxy.port, b"\x05\x01\x00", domain))[1] == 0


async def test_udp_and_bind_are_refused(proxy: Running) -> None:
    for command in (2, 3):
        request = bytes([5, command, 0, 3, 9]) + b"localhost" + struct.pack("!H", 80)
        assert (await exchange(proxy.port, b"\x05\x01\x00", request))[1] == 7


async def test_a_second_request_on_a_kept_alive_connection_never_reaches_another_host(
    proxy: Running, web: Server
) -> None:
    """Attack: an allowed request, then one for a denied host on the same connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    async with stream:
        await stream.send_all(
            f"GET http://localhost:{web.port}/json HTTP/1.1\r\nHost: localhost\r\n\r\n"
            "GET http://169.254.169.254/latest HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n".encode()
        )
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.") and b"toold" in data
    records = await recorded(proxy)
    assert all(record.host != "169.254.169.254" for record in records)
    assert all(seen.headers.get("host") != "169.254.169.254" or seen.path == "/latest" for seen in web.requests)
    assert {seen.path for seen in web.requests} <= {"/json", "/latest"}  # both went to the allowed host, if at all


async def test_a_host_neither_allowed_nor_denied_is_asked(proxy: Running) -> None:
    _code, out = await curl("-i", "-x", f"http://127.0.0.1:{proxy.port}", "http://unknown.example:80/")
    assert ("unknown.example", 80) in proxy.asked and "403" in out


async def test_ports_outside_the_list_are_refused(web: Server) -> None:
    async with running(EgressRules.of(allowed_domains=["localhost"])) as proxy:
        _code, out = await curl("-i", "-x", f"http://127.0.0.1:{proxy.port}", f"http://localhost:{web.port}/json")
    assert "403" in out and "port" in out
    assert not web.requests


async def test_a_call_past_its_byte_budget_is_cut(web: Server) -> None:
    rules = EgressRules.of(allowed_domains=["localhost"], allowed_ports=[web.port])
    records: list[Connection] = []

    async def decide(host: str, port: int) -> tuple[bool, str]:
        return rules.judge(host, port)[0] == "allow", "test"

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Proxy(decide, records.append, LOOPBACK, Budget(200_000)).serve, listeners[0])
        code, _out = await curl(
            "-o", "/dev/null", "-x", f"http://127.0.0.1:{port}", f"http://localhost:{web.port}/big?mb=5"
        )
        nursery.cancel_scope.cancel()
    assert code != 0  # the transfer was cut
    assert records[-1].received < 300_000 and "budget" in records[-1].refused


async def test_a_redirect_to_an_internal_address_is_judged_as_a_new_connection(proxy: Running, web: Server) -> None:
    """Attack: an allowed host redirects the client to the metadata service."""
    target = f"http://localhost:{web.port}/redirect?to=http://169.254.169.254/latest/meta-data/"
    _code, out = await curl("-i", "-L", "-x", f"http://127.0.0.1:{proxy.port}", target)
    assert "302" in out and "403" in out, out
    records = {r.host: r for r in await recorded(proxy, 2)}  # recorded as each closes, in any order
    assert set(records) == {"localhost", "169.254.169.254"} and records["169.254.169.254"].refused


class Rebinding(trio.abc.HostnameResolver):
    """Answers a public address to the first lookup of ``rebind.test`` and loopback after."""

    def __init__(self, first: str, then: str) -> None:
        self.answers = [first, then]
        self.lookups = 0

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):  # type: ignore[no-untyped-def]
        if host not in (b"rebind.test", "rebind.test"):
            return await trio.to_thread.run_sync(socket.getaddrinfo, host, port, family, type, proto, flags)
        address = self.answers[min(self.lookups, 1)]
        self.lookups += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    async def getnameinfo(self, sockaddr, flags):  # type: ignore[no-untyped-def]
        raise NotImplementedError


async def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_connected(web: Server) -> None:
    """Attack: DNS rebinding. The first answer is the (exempt) test server, any later one
    the metadata address; the proxy must look up once and connect to what it checked."""
    resolver = Rebinding("127.0.0.1", "169.254.169.254")
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        rules = EgressRules.of(allowed_domains=["rebind.test"], allowed_ports=[web.port])
        async with running(rules) as proxy:
            code, out = await curl("-sS", "-x", f"http://127.0.0.1:{proxy.port}", f"http://rebind.test:{web.port}/json")
            records = await recorded(proxy)
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert code == 0 and "toold" in out, out
    assert resolver.lookups == 1 and records[0].address == "127.0.0.1"


async def test_an_allowed_destination_where_nothing_listens_gets_a_502_and_a_record() -> None:
    """The connect is judged done from the socket itself: a refused one must still say so
    (HTTP 502, SOCKS reply 5), never pass for a connection."""
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    async with running(EgressRules.of(allowed_domains=["localhost"], allowed_ports=[closed])) as proxy:
        _code, out = await curl("-i", "-x", f"http://127.0.0.1:{proxy.port}", f"http://localhost:{closed}/")
        assert "502" in out, out
        record = (await recorded(proxy))[-1]
        assert record.refused.startswith("cannot connect") and "refused" in record.refused.lower(), record.refused
        code, _out = await curl("--socks5-hostname", f"127.0.0.1:{proxy.port}", f"http://localhost:{closed}/")
        assert code != 0
        assert (await recorded(proxy, 2))[-1].refused.startswith("cannot connect")


class OutOfDescriptors(trio.abc.Listener[trio.SocketStream]):
    """A listener whose first accepts fail as a process out of descriptors sees them fail."""

    def __init__(self, listener: trio.SocketListener, failures: int) -> None:
        self.listener = listener
        self.failures = failures

    async def accept(self) -> trio.SocketStream:
        if self.failures:
            self.failures -= 1
            await trio.sleep(0)
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.listener.accept()

    async def aclose(self) -> None:
        await self.listener.aclose()


async def test_a_proxy_out_of_descriptors_accepts_again_once_it_can(web: Server) -> None:
    rules = EgressRules.of(allowed_domains=["localhost"], allowed_ports=[web.port])

    async def decide(host: str, port: int) -> tuple[bool, str]:
        judgement, why, _normal = rules.judge(host, port)
        return judgement == "allow", why

    (real,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = OutOfDescriptors(real, failures=3)
    records: list[Connection] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Proxy(decide, records.append, LOOPBACK).serve, listener)
        port = real.socket.getsockname()[1]
        code, out = await curl("-x", f"http://127.0.0.1:{port}", f"http://localhost:{web.port}/json")
        assert code == 0 and "toold" in out, out
        assert listener.failures == 0
        nursery.cancel_scope.cancel()


async def test_a_request_naming_its_url_reaches_the_server_with_the_judged_host(proxy: Running, web: Server) -> None:
    """Attack (domain fronting): an allowed URL with another site's ``Host`` (twice, in two
    spellings), which a server hosting many sites would route by. The proxy writes the
    judged host instead, as a proxy must for a request naming its URL."""
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
    reply = b""
    async with stream:
        await stream.send_all(
            f"GET http://LOCALHOST:{web.port}/json HTTP/1.1\r\nHost: evil.example\r\nhOsT: evil.example:80\r\n"
            "X-Kept: yes\r\n\r\n".encode()
        )
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):  # to the end: the server closes
                reply += chunk
    assert reply.startswith(b"HTTP/1.") and b"toold" in reply, reply
    seen = web.requests[-1]
    assert seen.headers.get("host") == f"localhost:{web.port}", seen.headers
    assert seen.headers.get("x-kept") == "yes"  # the others go on as they came
    assert (await recorded(proxy))[-1].host == "localhost"
