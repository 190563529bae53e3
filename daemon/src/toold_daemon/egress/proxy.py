"""A filtering forward proxy: HTTP ``CONNECT``, plain HTTP with an absolute URI, and
SOCKS5 ``CONNECT``, on one listening socket (the first byte tells them apart: SOCKS5
starts with 5, an HTTP request with a letter).

Each client connection reaches exactly one destination, judged before anything is sent:
``decide(host, port)`` (the rules, then the person) says whether it may, and the proxy
itself resolves the name, refuses it if any address it resolves to is private (unless
exempt), and connects to an address it checked, so a name that rebinds between the check
and the connection reaches nothing new. A plain HTTP request is forwarded with
``Connection: close``: whatever the client sends after it on the same connection goes to
the same, already allowed, destination, never to another host.

A refused destination is a clean answer (``403`` for HTTP, reply code 2 for SOCKS5) and
the connection closes; nothing hangs. Bytes each way are counted per call, and a call
past its byte budget has its connections closed.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import select
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from ..web.addresses import IPAddress, IPNetwork, Refused, address_refusal, literal_address, normal_host
from .relay import Budget, relay

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
FIRST_BYTE_SECONDS = 30.0
CONNECT_SECONDS = 15.0
_CHUNK = 64 * 1024
#: What ``accept`` fails with when the process is out of room, and how long to wait then.
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_SECONDS = 0.1

#: (host, port) -> (allowed, why). Called once per client connection.
Decide = Callable[[str, int], Awaitable[tuple[bool, str]]]


class Denied(Exception):
    """The destination may not be reached; the message says why."""


class Connection(msgspec.Struct):
    """One client connection's record, for the call's journal entry."""

    host: str = ""
    port: int = 0
    protocol: str = ""  # connect | http | socks5
    address: str = ""  # what was connected to
    allowed_by: str = ""
    refused: str = ""
    sent: int = 0  # client -> destination
    received: int = 0  # destination -> client


class Proxy(msgspec.Struct):
    decide: Decide
    record: Callable[[Connection], None]
    allowed_networks: Sequence[IPNetwork] = ()
    budget: Budget = msgspec.field(default_factory=lambda: Budget(1 << 62))
    #: Whether a connection comes from the call's own command; one that does not is
    #: closed unread and unrecorded (None: every connection is taken as the call's).
    from_the_call: Callable[[trio.socket.SocketType], bool] | None = None
    #: Connections being served now. Once ``serve`` is cancelled with none, nothing more
    #: goes out and no record is to come: a connection whose task has not run yet meets
    #: the cancellation before it reads a byte.
    serving: int = 0
    foreign: int = 0  # connections closed as made by another command

    async def serve(self, listener: trio.abc.Listener[trio.SocketStream]) -> None:
        """Accept and serve connections until cancelled. Out of descriptors or memory (a
        command holding many connections open), it waits a moment and accepts again: the
        connections it serves meanwhile go on, and so does the proxy."""
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await listener.accept()
                except trio.ClosedResourceError:
                    return  # closed as its call was forgotten
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    log.warning("egress proxy cannot accept (%s); retrying shortly", os.strerror(exc.errno or 0))
                    await trio.sleep(_ACCEPT_RETRY_SECONDS)
                    continue
                if self.from_the_call is not None and not self.from_the_call(stream.socket):
                    self.foreign += 1
                    await stream.aclose()
                    continue
                nursery.start_soon(self._serve_one, stream)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        connection = Connection()
        self.serving += 1
        try:
            async with stream:
                with trio.fail_after(FIRST_BYTE_SECONDS):
                    first = await stream.receive_some(_CHUNK)
                if not first:
                    return
                if first[0] == 5:
                    await self._socks5(stream, first, connection)
                else:
                    await self._http(stream, first, connection)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            connection.refused = connection.refused or f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # one client's garbage must never stop the proxy for the others
            log.warning("egress connection failed: %s", exc, exc_info=True)
            connection.refused = connection.refused or f"{type(exc).__name__}: {exc}"
        finally:
            if connection.host:
                self.record(connection)
            self.serving -= 1

    # ------------------------------------------------------------------ HTTP

    async def _http(self, stream: trio.SocketStream, data: bytes, connection: Connection) -> None:
        head, rest = await _read_head(stream, data)
        if head is None:
            await _answer(stream, 400, "the request head is too long or incomplete")
            return
        lines = head.split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ")
        except ValueError:
            await _answer(stream, 400, "not an HTTP request line")
            return
        if method.upper() == "CONNECT":
            connection.protocol = "connect"
            host, port = _split_host_port(target, default=443)
            upstream = await self._open(host, port, connection, stream, http=True)
            if upstream is None:
                return
            await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._relay(stream, upstream, rest, connection)
            return
        connection.protocol = "http"
        if not target.lower().startswith("http://"):
            await _answer(stream, 400, "a proxy request names an http:// URL (https goes through CONNECT)")
            return
        authority, _, path = target[7:].partition("/")
        host, port = _split_host_port(authority.rsplit("@", 1)[-1], default=80)
        upstream = await self._open(host, port, connection, stream, http=True)
        if upstream is None:
            return
        request = _origin_form(method, "/" + path, version, lines[1:], host=_host_field(connection.host, port))
        await self._relay(stream, upstream, request + rest, connection)

    # ------------------------------------------------------------------ SOCKS5

    async def _socks5(self, stream: trio.SocketStream, data: bytes, connection: Connection) -> None:
        connection.protocol = "socks5"
        buffered = _Buffered(stream, data)
        _version, count = await buffered.take_struct("BB")
        methods = await buffered.take(count)
        if 0 not in methods:
            await stream.send_all(b"\x05\xff")
            return
        await stream.send_all(b"\x05\x00")
        _version, command, _reserved, kind = await buffered.take_struct("BBBB")
        if kind == 1:
            host = str(ipaddress.IPv4Address(await buffered.take(4)))
        elif kind == 4:
            host = str(ipaddress.IPv6Address(await buffered.take(16)))
        elif kind == 3:
            (size,) = await buffered.take_struct("B")
            host = (await buffered.take(size)).decode("ascii", "replace")  # names travel as punycode
        else:
            await stream.send_all(_socks_reply(8))
            return
        (port,) = await buffered.take_struct("!H")
        if command != 1:  # BIND and UDP ASSOCIATE: commands reach TCP destinations only
            connection.host, connection.port = host, port
            connection.refused = "only SOCKS5 CONNECT is served (no BIND, no UDP)"
            await stream.send_all(_socks_reply(7))
            return
        upstream = await self._open(host, port, connection, stream, http=False)
        if upstream is None:
            return
        await stream.send_all(_socks_reply(0))
        await self._relay(stream, upstream, buffered.leftover(), connection)

    # ------------------------------------------------------------------ connecting

    async def _open(
        self, host: str, port: int, connection: Connection, client: trio.SocketStream, *, http: bool
    ) -> trio.SocketStream | None:
        """Judge and connect; on refusal answer the client and return None."""
        connection.host, connection.port = host, port
        try:
            if not host or not 0 < port < 65536:
                raise Denied(f"{host!r}:{port} is not a destination")
            # judged, asked about, connected to and recorded as the name the resolver looks up
            with contextlib.suppress(Refused):  # (no host name: kept as it came, for the rules to refuse)
                host = connection.host = normal_host(host)
            allowed, why = await self.decide(host, port)
            if not allowed:
                raise Denied(why)
            connection.allowed_by = why
            with trio.fail_after(CONNECT_SECONDS):
                upstream, address = await connect_checked(host, port, self.allowed_networks)
            connection.address = str(address)
            return upstream
        except (Denied, Refused) as exc:
            connection.refused = str(exc)
            code = 403
        except (OSError, trio.TooSlowError) as exc:
            connection.refused = f"cannot connect: {exc}"
            code = 502
        if http:
            await _answer(client, code, connection.refused)
        else:
            await client.send_all(_socks_reply(2 if code == 403 else 5))
        return None

    async def _relay(
        self, client: trio.SocketStream, upstream: trio.SocketStream, first: bytes, connection: Connection
    ) -> None:
        async with upstream:
            if first:
                if not self.budget.spend(len(first)):
                    connection.refused = "the call's network byte budget is spent"
                    return
                await upstream.send_all(first)
                connection.sent += len(first)

            def count(outbound: bool, moved: int) -> None:
                if outbound:
                    connection.sent += moved
                else:
                    connection.received += moved

            def spent() -> None:
                connection.refused = "the call's network byte budget is spent"

            await relay(client, upstream, self.budget, count, spent)


async def connect_checked(
    host: str, port: int, allowed_networks: Sequence[IPNetwork]
) -> tuple[trio.SocketStream, IPAddress]:
    """Resolve ``host`` once, refuse it if any address is refused, connect to the checked
    addresses in order (never resolving again)."""
    literal = literal_address(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            answers = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise Denied(f"{host} could not be resolved ({exc})") from None
        addresses = []
        for *_ignored, sockaddr in answers:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
            if address not in addresses:
                addresses.append(address)
    for address in addresses:
        why = address_refusal(address, allowed_networks)
        if why:
            shown = host if str(address) == host else f"{host} resolves to {address}, which"
            raise Denied(f"{shown} is refused: {why.split(' is ', 1)[-1]}")
    error: OSError | None = None
    for address in addresses:
        try:
            return await _connect(address, port), address
        except OSError as exc:
            error = exc
    raise error or OSError(f"{host} has no address")


async def _connect(address: IPAddress, port: int) -> trio.SocketStream:
    """A TCP connection to an address already checked (no resolving, no racing).

    A connection to this machine (a local registry, a test server) is made by the time
    ``connect`` returns, yet trio would still wait for the event loop's next round to
    learn it (~0.1-0.6 ms on a busy loop): the socket is asked first."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        try:
            sock.connect((str(address), port))
        except BlockingIOError:
            if not _writable_now(sock):
                await trio.lowlevel.wait_writable(sock)
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, f"Error connecting to {address}:{port}: {os.strerror(error)}") from None
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


def _writable_now(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(0))


# ---- small pieces -------------------------------------------------------------------------


class _Buffered:
    def __init__(self, stream: trio.SocketStream, data: bytes) -> None:
        self.stream = stream
        self.buffer = bytearray(data)

    async def take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            data = await self.stream.receive_some(_CHUNK)
            if not data:
                raise trio.BrokenResourceError("the client closed mid-request")
            self.buffer += data
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise trio.BrokenResourceError("a SOCKS request too long")
        taken = bytes(self.buffer[:size])
        del self.buffer[:size]
        return taken

    async def take_struct(self, layout: str) -> tuple[int, ...]:
        fmt = struct.Struct(layout if layout.startswith("!") else "!" + layout)
        return fmt.unpack(await self.take(fmt.size))

    def leftover(self) -> bytes:
        return bytes(self.buffer)


async def _read_head(stream: trio.SocketStream, data: bytes) -> tuple[bytes | None, bytes]:
    buffer = bytearray(data)
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_HEAD_BYTES:
            return None, b""
        more = await stream.receive_some(_CHUNK)
        if not more:
            return None, b""
        buffer += more
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    return head, rest


def _split_host_port(authority: str, *, default: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host, port_text = authority, ""
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        port = 0
    return host, port


_HOP_BY_HOP = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}
#: Header fields the proxy writes itself in a request it forwards.
_REPLACED = _HOP_BY_HOP | {b"host"}


def _origin_form(method: str, path: str, version: str, headers: list[bytes], *, host: str) -> bytes:
    """The request as the server takes it. Its ``Host`` is the one judged (as a proxy must
    do with a request naming its URL, RFC 9112 3.2.2): one the command wrote beside an
    allowed URL would ask a server hosting many sites (a CDN) for another site."""
    kept = [h for h in headers if h.split(b":", 1)[0].strip().lower() not in _REPLACED]
    lines = [f"{method} {path} {version}".encode("latin-1"), b"Host: " + host.encode("ascii"), *kept]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _host_field(host: str, port: int) -> str:
    """``Host`` for ``host`` (judged, in normal form) and ``port``."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 80 else f"{shown}:{port}"


async def _answer(stream: trio.SocketStream, code: int, why: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(code, "Error")
    body = f"toold egress proxy: {why}\n".encode()
    head = f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
    try:
        await stream.send_all(head.encode() + b"Connection: close\r\n\r\n" + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


def _socks_reply(code: int) -> bytes:
    return bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])
