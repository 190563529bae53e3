"""``toold doctor``'s "proxy connections": whether a command's proxy listener can tell
its own command's connections from those of the zygote's other commands (the kernel's
socket diagnostics report a socket's cgroup, and calls have cgroups in cgroup2)."""

from __future__ import annotations

import msgspec

from toold_daemon.config import Config
from toold_daemon.operation.checks import _proxy_connections, proxy_connections


def test_the_check_is_on_only_where_connections_can_be_told_apart() -> None:
    assert proxy_connections(True, "", per_call_cgroup2=True).on
    off = proxy_connections(True, "", per_call_cgroup2=False)
    assert not off.on and "no per-call cgroups in cgroup2" in off.detail
    old_kernel = proxy_connections(
        True, "the kernel does not report a socket's cgroup (Linux 5.7)", per_call_cgroup2=True
    )
    assert not old_kernel.on and "Linux 5.7" in old_kernel.detail
    assert proxy_connections(False, "no socket diagnostics", per_call_cgroup2=False).on  # nothing uses the proxy


def test_this_machine_tells_them_apart_but_not_without_cgroups_and_host_mode_needs_no_check() -> None:
    assert _proxy_connections(Config()).on, _proxy_connections(Config()).detail
    host = msgspec.convert({"tools": {"network": {"mode": "host"}}}, Config)
    assert _proxy_connections(host).detail == "no command goes through the egress proxy"
    without_cgroups = msgspec.convert({"tools": {"isolation": {"cgroups": False}}}, Config)
    assert not _proxy_connections(without_cgroups).on
