"""The last network fallback: Landlock's TCP rules, on the real kernel, and how the
daemon reports which layer cut the network."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from toold_daemon.isolation import kernel
from toold_daemon.isolation.confine import network_report

# Only Landlock (TCP rules, no filesystem rights taken away that the check needs), no
# network namespace and no seccomp filter: what a kernel without both would leave.
CHILD = textwrap.dedent(
    """
    import errno, socket, sys
    from toold_daemon.isolation import kernel
    abi = kernel.landlock_abi()
    everything = kernel.fs_access_for_abi(abi)
    ruleset = kernel.landlock_ruleset([("/", everything)], abi, deny_tcp=True)
    kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
    kernel.landlock_restrict_self(ruleset)
    outcome = {}
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
        outcome["connect"] = "ok"
    except OSError as exc:
        outcome["connect"] = errno.errorcode.get(exc.errno, str(exc))
    try:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        outcome["bind"] = "ok"
    except OSError as exc:
        outcome["bind"] = errno.errorcode.get(exc.errno, str(exc))
    a, b = socket.socketpair()
    a.send(b"x")
    outcome["unix"] = "ok" if b.recv(1) == b"x" else "broken"
    print(outcome)
    """
)


@pytest.mark.skipif(not kernel.landlock_denies_tcp(kernel.landlock_abi()), reason="Landlock ABI < 4 (Linux < 6.7)")
def test_landlock_tcp_rules_refuse_connect_and_bind_but_keep_unix_sockets() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        reachable = subprocess.run(
            [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port})).close()"],
            check=False,
        )
        assert reachable.returncode == 0  # the server is there for an unconfined process
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(port)], capture_output=True, text=True, check=True
        ).stdout
    assert eval(out) == {"connect": "EACCES", "bind": "EACCES", "unix": "ok"}


def test_the_report_names_the_strongest_layer_that_cut_the_network() -> None:
    def report(namespace: str, seccomp: str, landlock_tcp: bool, allowed: bool = False) -> str:
        return network_report(allowed=allowed, namespace=namespace, seccomp=seccomp, landlock_tcp=landlock_tcp)

    assert report("", "on", True, allowed=True) == "on (network allowed for this call)"
    assert report("on (cut off: new network namespace)", "on", True) == "on (cut off: new network namespace)"
    assert report("off: refused (EPERM)", "on", True) == "on (cut off: seccomp refuses every socket, AF_UNIX included)"
    partial = report("off: refused (EPERM)", "off: no filter for riscv64", True)
    assert partial.startswith("on (partial") and "UDP" in partial
    nothing = report("off: refused (EPERM)", "off: no filter for riscv64", False)
    assert nothing.startswith("off") and "seccomp" in nothing and "Landlock" in nothing
