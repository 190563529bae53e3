"""Which URLs and addresses ``web_fetch`` may reach: the server-side request forgery rules.

Pure functions. A URL is checked twice: by its text (scheme, port, host names, a host
written as a number in any of the forms ``inet_aton`` accepts) before anyone is asked
about the call, and by every address its host resolves to when it connects (see
``connect``): one address inside a refused network refuses the whole host.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable, Sequence

import msgspec

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}

# Networks never reached unless ``allowed_networks`` names them, with what to call them.
_REFUSED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "an unspecified ('this network') address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT (shared) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address (cloud metadata lives here)"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "a reserved (IETF protocol) address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a reserved (benchmarking) address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
    ("::/128", "the unspecified address"),
    ("::1/128", "the loopback address"),
    ("::/96", "an IPv4-compatible address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("fc00::/7", "a unique-local address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
)
REFUSED_NETWORKS: tuple[tuple[IPNetwork, str], ...] = tuple((ipaddress.ip_network(cidr), why) for cidr, why in _REFUSED)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class Refused(Exception):
    """A URL or address that web_fetch will not reach; the message says why."""


class Reach(msgspec.Struct, frozen=True):
    """What the administrator lets ``web_fetch`` reach (from ``[tools.web]``)."""

    ports: frozenset[int]
    allowed_networks: tuple[IPNetwork, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    #: Hosts whose GETs run without asking (matched, like the others, in normal form).
    trusted_hosts: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        allowed_ports: Iterable[int] = (),
        allowed_networks: Iterable[str] = (),
        denied_hosts: Iterable[str] = (),
        allowed_hosts: Iterable[str] = (),
        trusted_hosts: Iterable[str] = (),
    ) -> Reach:
        return cls(
            ports=frozenset({80, 443, *allowed_ports}),
            allowed_networks=tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks),
            denied_hosts=tuple(host_pattern(h) for h in denied_hosts),
            allowed_hosts=tuple(host_pattern(h) for h in allowed_hosts),
            trusted_hosts=tuple(host_pattern(h) for h in trusted_hosts),
        )


def numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address a host written as a number stands for, in every form the C library
    accepts (``2130706433``, ``0x7f.1``, ``127.1``, ``017700000001``), or None for a name."""
    parts = host.split(".")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # a trailing dot
    if not 1 <= len(parts) <= 4:
        return None
    numbers: list[int] = []
    for part in parts:
        value = _number(part)
        if value is None:
            return None
        numbers.append(value)
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, number in enumerate(leading):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _number(part: str) -> int | None:
    try:
        if part[:2].lower() == "0x":
            return int(part[2:] or "0", 16)
        if len(part) > 1 and part.startswith("0"):
            return int(part[1:], 8)
        return int(part, 10) if part.isascii() and part.isdigit() else None
    except ValueError:
        return None


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address if it is one (IPv6 with or without brackets, or IPv4 in any
    numeric form), else None. A zone index (``fe80::1%eth0``) is refused outright."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "%" in bare:
        raise Refused(f"{host} names a network interface (a zone index); only global addresses are reached")
    if ":" in bare:
        try:
            return ipaddress.IPv6Address(bare)
        except ValueError:
            return None
    return numeric_ipv4(bare)


def normal_host(host: str) -> str:
    """The host as it will be connected to: the name the resolver looks up (see
    ``ascii_host``), lower case, no trailing dot, and a numeric host in its one canonical
    form (``0x7f.1`` → ``127.0.0.1``). Raises ``Refused`` for a name no resolver takes."""
    ascii_name = ascii_host(host)
    address = literal_address(ascii_name)
    if address is None:
        return ascii_name.lower().rstrip(".")
    return str(address)


def ascii_host(host: str) -> str:
    """``host`` in the ASCII form a lookup of it uses: Python's resolver turns a name that
    is not ASCII into IDNA's (the ``idna`` codec), which also maps letters to others and
    drops some altogether (``ev\u00adil.com`` and ``ｅｖｉｌ。com`` are looked up as
    ``evil.com``), and the C library stops at a NUL. Judging a name in any other spelling
    than the one looked up would let such a spelling past a denied name; so names are
    judged, and connected to, as this form."""
    # The C library's lookup ends a name at its first NUL ("localhost\x00x" is looked up
    # as localhost), and no name holds a control character. (An ASCII text is printable
    # exactly when it holds none: the one test on the usual path.)
    if host.isascii() and host.isprintable():
        return host
    if any(c < " " or c == "\x7f" for c in host):
        raise Refused(f"{host!r} holds a control character; it is not a host name")
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        raise Refused(f"{host!r} is not a host name a resolver takes") from None


def host_pattern(pattern: str) -> str:
    """A configured host glob (``*.bücher.de``) as the names it is matched against are
    written: ASCII, lower case, no trailing dot (one that cannot be written so is kept in
    lower case, and matches nothing)."""
    try:
        written = ascii_host(pattern)
    except Refused:
        written = pattern
    return written.lower().rstrip(".")


def embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, NAT64, 6to4, Teredo client): a
    packet to it may reach them."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


def address_refusal(address: IPAddress, allowed: Sequence[IPNetwork]) -> str:
    """Why ``address`` is not reached ("" when it may be)."""
    candidates: list[IPAddress] = [address, *embedded_ipv4(address)]
    if any(c.version == net.version and c in net for c in candidates for net in allowed):
        return ""
    for candidate in candidates:
        for network, why in REFUSED_NETWORKS:
            if candidate.version == network.version and candidate in network:
                return f"{candidate} is {why}"
        if not candidate.is_global:
            return f"{candidate} is not a global address"
    return ""


def host_matches(host: str, patterns: Iterable[str]) -> bool:
    """Whether ``host`` matches one of the globs (``*.example.com`` matches its
    subdomains; list ``example.com`` as well for the name itself)."""
    return any(fnmatch.fnmatchcase(host, pattern) for pattern in patterns)


def check_target(scheme: str, host: str, port: int | None, reach: Reach) -> str:
    """Check a URL's parts by their text and return its host in normal form; raises
    ``Refused``. Addresses behind a name are checked when connecting."""
    if scheme not in DEFAULT_PORTS:
        raise Refused(f"only http and https URLs are fetched, not {scheme or 'a URL without a scheme'}")
    if not host:
        raise Refused("the URL has no host")
    effective_port = port if port is not None else DEFAULT_PORTS[scheme]
    if effective_port not in reach.ports:
        allowed = ", ".join(str(p) for p in sorted(reach.ports))
        raise Refused(f"port {effective_port} is not allowed (allowed: {allowed}; [tools.web] allowed_ports adds more)")
    normal = normal_host(host)
    if host_matches(normal, reach.denied_hosts):
        raise Refused(f"{normal} is in [tools.web] denied_hosts")
    if reach.allowed_hosts and not host_matches(normal, reach.allowed_hosts):
        raise Refused(f"{normal} is not in [tools.web] allowed_hosts")
    address = literal_address(normal)
    if address is not None:
        why = address_refusal(address, reach.allowed_networks)
        if why:
            raise Refused(f"{why}; [tools.web] allowed_networks can exempt a network")
    return normal
