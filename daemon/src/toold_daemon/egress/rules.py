"""What a command's connection may reach, by the host's name and port alone.

Names are judged first (denied, then allowed); a name that is neither is asked about.
Every address a name resolves to is checked again when connecting (``proxy``), with the
same private-address refusal as ``web_fetch``: an allowed name that resolves to
127.0.0.1 or 169.254.169.254 is still refused, unless ``allowed_networks`` exempts it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Literal

import msgspec

from ..config import NetworkConfig
from ..web.addresses import (
    IPNetwork,
    Refused,
    address_refusal,
    host_matches,
    host_pattern,
    literal_address,
    normal_host,
)

Judgement = Literal["allow", "deny", "ask"]


class EgressRules(msgspec.Struct, frozen=True):
    allowed_domains: tuple[str, ...] = ()
    denied_domains: tuple[str, ...] = ()
    ports: frozenset[int] = frozenset({80, 443})
    allowed_networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(
        cls,
        *,
        allowed_domains: Iterable[str] = (),
        denied_domains: Iterable[str] = (),
        allowed_ports: Iterable[int] = (80, 443),
        allowed_networks: Iterable[str] = (),
    ) -> EgressRules:
        return cls(
            allowed_domains=tuple(host_pattern(d) for d in allowed_domains),
            denied_domains=tuple(host_pattern(d) for d in denied_domains),
            ports=frozenset(allowed_ports),
            allowed_networks=tuple(ipaddress.ip_network(n, strict=False) for n in allowed_networks),
        )

    def judge(self, host: str, port: int) -> tuple[Judgement, str, str]:
        """(judgement, why, the host in normal form) for a connection to ``host:port``."""
        try:
            normal = normal_host(host)
        except Refused as exc:
            return "deny", str(exc), host
        if not normal or len(normal) > 253 or any(c.isspace() or c in "/@?#" for c in normal):
            return "deny", f"{host!r} is not a host name", normal
        if port not in self.ports:
            allowed = ", ".join(str(p) for p in sorted(self.ports))
            return "deny", f"port {port} is not allowed (allowed: {allowed}; [tools.network] allowed_ports)", normal
        if host_matches(normal, self.denied_domains):
            return "deny", f"{normal} is in [tools.network] denied_domains", normal
        address = literal_address(normal)
        if address is not None:
            why = address_refusal(address, self.allowed_networks)
            if why:
                return "deny", f"{why} ([tools.network] allowed_networks can exempt a network)", normal
        if host_matches(normal, self.allowed_domains):
            return "allow", f"{normal} is in [tools.network] allowed_domains", normal
        # allowed_networks only exempts addresses from the private-address refusal: an
        # address there is still judged by name like any other, so it is asked about
        return "ask", f"{normal} is neither allowed nor denied", normal


#: Built-in tools whose commands may want the network (command tools are named in the config).
NETWORKED_TOOLS = frozenset({"shell", "run_command", "run_code"})


def network_summary(network: NetworkConfig, tool: str) -> str:
    """How ``tool``'s commands reach the network, for ``policy explain`` and ``doctor``."""
    mode = network.mode_of(tool)
    if mode == "host":
        return "host (the host's network, unfiltered)"
    if mode == "none":
        return "none (no network at all)"
    allowed = ", ".join(network.allowed_domains[:5]) or "none"
    more = "…" if len(network.allowed_domains) > 5 else ""
    return f"proxy (allowed domains: {allowed}{more}; other hosts are asked about)"
