"""Connecting only where the rules allow: a network backend for httpcore that resolves a
host once, checks every address it resolves to, and connects to a checked address.

There is no second lookup between the check and the connection, so a name that answers
a public address to the check and a private one to the connection (DNS rebinding) gets
nowhere. TLS and the ``Host`` header still use the name (httpcore takes them from the
URL, not from the address connected to). Every connection goes through here, redirects
included.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence

import httpcore

from .addresses import IPAddress, IPNetwork, Refused, address_refusal, literal_address


class NameNotResolved(Exception):
    """DNS gave no address for the host."""


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, in the resolver's order, without duplicates."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise NameNotResolved(f"{host} could not be resolved: {getattr(exc, 'strerror', None) or exc}") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise NameNotResolved(f"{host} resolved to no address")
    return addresses


def checked_addresses(host: str, port: int, allowed: Sequence[IPNetwork]) -> list[IPAddress]:
    """``host``'s addresses, if none of them is refused; raises ``Refused`` naming the
    first that is (one private answer refuses the name: which one a later connection
    would use is not ours to choose)."""
    addresses = resolve(host, port)
    for address in addresses:
        why = address_refusal(address, allowed)
        if why:
            shown = host if str(address) == host else f"{host} resolves to {address}, which"
            raise Refused(f"{shown} is refused: {why.split(' is ', 1)[1]}; [tools.web] allowed_networks can exempt it")
    return addresses


class CheckedBackend(httpcore.SyncBackend):
    """httpcore's synchronous backend, connecting only to checked addresses.
    ``exempt``: (host, port) pairs reached without the check (the administrator's proxy)."""

    def __init__(self, allowed: Sequence[IPNetwork], exempt: Iterable[tuple[str, int]] = ()) -> None:
        self.allowed = tuple(allowed)
        self.exempt = frozenset(exempt)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        if (host, port) in self.exempt:
            return super().connect_tcp(host, port, timeout, local_address, socket_options)
        addresses = checked_addresses(host, port, self.allowed)
        last: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(str(address), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise Refused("web_fetch never connects to a Unix socket")
