"""Telling which cgroup made the other end of a loopback connection, against the real
kernel: processes moved into cgroups of their own connect to listeners here, and the
proxy serves a call's listener only for the connections its own cgroup made."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import trio

from tests.daemon.test_egress_proxy import LOOPBACK
from tests.webserver import Server, serving
from toold_daemon.egress.peers import LoopbackPeers, open_diagnostics
from toold_daemon.egress.proxy import Connection, Proxy
from toold_daemon.egress.relay import Budget
from toold_daemon.isolation import cgroup
from toold_daemon.isolation.cgroup import Cgroups

#: Joins the cgroups given (one path per hierarchy, comma-separated), connects to the
#: port given, sends what is given and prints the first reply (or nothing when the
#: connection is closed unanswered).
_CONNECT = """
import socket, sys
for path in sys.argv[1].split(","):
    with open(path + "/cgroup.procs", "w") as procs:
        procs.write("0")
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
s.sendall(sys.argv[3].encode())
s.settimeout(10)
try:
    sys.stdout.write(s.recv(65536).decode(errors="replace"))
except ConnectionResetError:
    pass
"""


@pytest.fixture
def two_calls(cgroups: Cgroups) -> tuple[str, str]:
    """Two call cgroups as the daemon makes them, each with the id its sockets carry."""
    calls = (cgroups.call_group(pids_max=16, memory_max=1 << 30), cgroups.call_group(pids_max=16, memory_max=1 << 30))
    if not all(cgroups.socket_id(name) for name in calls):
        pytest.skip("no cgroups in the unified hierarchy here")
    return calls


def _joining(cgroups: Cgroups, name: str) -> str:
    return ",".join(cgroups.paths(name))


@pytest.fixture
def peers() -> Iterator[LoopbackPeers]:
    diagnostics, why_not = open_diagnostics()
    if diagnostics is None:
        pytest.skip(why_not)
    found = LoopbackPeers(diagnostics)
    yield found
    found.close()


def test_the_cgroup_that_made_a_connection_is_told(
    cgroups: Cgroups, two_calls: tuple[str, str], peers: LoopbackPeers
) -> None:
    ids = [cgroups.socket_id(name) for name in two_calls]
    assert ids[0] != ids[1]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        for name, expected in zip(two_calls, ids, strict=True):
            child = subprocess.Popen([sys.executable, "-c", _CONNECT, _joining(cgroups, name), str(port), "hi"])
            accepted, _ = listener.accept()
            with accepted:
                assert peers.cgroup_of(accepted.getpeername(), accepted.getsockname()) == expected
                accepted.sendall(b"bye")
            child.wait(10)
        with socket.create_connection(("127.0.0.1", port)) as own, listener.accept()[0] as accepted:
            mine = peers.cgroup_of(accepted.getpeername(), accepted.getsockname())
            assert mine is not None and mine not in ids
            assert peers.cgroup_of(own.getsockname(), own.getpeername()) == mine


def test_a_connection_gone_on_both_sides_or_not_on_loopback_is_told_by_no_one(peers: LoopbackPeers) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        near, far = client.getsockname(), client.getpeername()
        assert peers.cgroup_of(near, far) is not None
        client.close()
        accepted.close()
        assert peers.cgroup_of(near, far) is None
    assert peers.cgroup_of(("::1", 1), ("::1", 2)) is None
    assert peers.cgroup_of(("127.0.0.1", 1), ("127.0.0.1", 1)) is None  # nothing there


@pytest.fixture
def web() -> Iterator[Server]:
    with serving() as server:
        yield server


async def test_a_proxy_serves_only_the_connections_its_calls_cgroup_made(
    cgroups: Cgroups, two_calls: tuple[str, str], peers: LoopbackPeers, web: Server
) -> None:
    """Attack: a process of another cgroup (another command of the zygote) leaves a
    request in the call's listener. It is closed unanswered and recorded nowhere; the
    call's own request goes through."""
    own, other = two_calls
    records: list[Connection] = []

    async def decide(host: str, port: int) -> tuple[bool, str]:
        return True, "test"

    def made_in_own(connection: trio.socket.SocketType) -> bool:
        return peers.cgroup_of(connection.getpeername(), connection.getsockname()) == cgroups.socket_id(own)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    proxy = Proxy(decide, records.append, LOOPBACK, Budget(1 << 30), made_in_own)

    async def request(name: str, mark: str) -> str:
        text = f"GET http://127.0.0.1:{web.port}/{mark} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        done = await trio.run_process(
            [sys.executable, "-c", _CONNECT, _joining(cgroups, name), str(port), text], capture_stdout=True, check=True
        )
        return done.stdout.decode()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(proxy.serve, listeners[0])
        assert await request(other, "borrowed") == ""
        assert (await request(own, "own")).startswith("HTTP/1.")
        with trio.fail_after(5):
            while not records:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert proxy.foreign == 1
    assert [r.port for r in records] == [web.port]
    assert [r.path for r in web.requests] == ["/own"]


#: Joins the cgroups given, makes a TCP socket there and hands it over the fd given first,
#: then exits.
_MAKE_AND_HAND_OVER = """
import socket, sys
for path in sys.argv[2:]:
    with open(path + "/cgroup.procs", "w") as procs:
        procs.write("0")
made = socket.socket()
socket.send_fds(socket.socket(fileno=int(sys.argv[1])), [b"s"], [made.fileno()])
"""


def test_a_socket_made_during_an_earlier_use_of_a_kept_cgroup_is_not_the_later_calls(
    cgroups: Cgroups, peers: LoopbackPeers
) -> None:
    """Attack: a command makes a socket and hands it to a process that outlives its call
    (another command's background job), then ends; its cgroup is kept and given to a
    later call. Connected then, the socket must not pass as the later call's own: each
    use of a kept cgroup has an innermost cgroup, and so an id, of its own."""
    name = cgroups.call_group(pids_max=16, memory_max=1 << 30)
    first = cgroups.socket_id(name)
    if not first:
        pytest.skip("no cgroups in the unified hierarchy here")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        maker = subprocess.Popen(
            [sys.executable, "-c", _MAKE_AND_HAND_OVER, str(theirs.fileno()), *cgroups.paths(name)],
            pass_fds=[theirs.fileno()],
        )
        assert maker.wait(10) == 0
        _, (fd,), _, _ = socket.recv_fds(ours, 16, 1)
    handed = socket.socket(fileno=fd)
    deadline = time.monotonic() + 5
    while not cgroups.release(name):  # the maker leaves the cgroup as it is reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert cgroups.call_group(pids_max=16, memory_max=1 << 30) == name  # kept, and taken again
    later = cgroups.socket_id(name)
    assert later and later != first
    with socket.socket() as listener, handed:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        handed.connect(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            assert peers.cgroup_of(accepted.getpeername(), accepted.getsockname()) == first != later


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed (scripts/bootstrap installs it)")
def test_iproute2s_ss_names_the_same_cgroup_for_a_connection(
    cgroups: Cgroups, two_calls: tuple[str, str], peers: LoopbackPeers
) -> None:
    """Outside proof: `ss --cgroup` reads a socket's cgroup through the same kernel
    interface with iproute2's own code, and names it by path (below the cgroup2 mount):
    that path is the call's innermost cgroup, whose id is the one we read."""
    name = two_calls[0]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-c", _CONNECT, _joining(cgroups, name), str(port), "hi"], stdout=subprocess.DEVNULL
        )
        accepted, (host, peer_port) = listener.accept()
        with accepted:
            shown = subprocess.run(
                ["ss", "-tnH", "--cgroup", "src", f"{host}:{peer_port}"], capture_output=True, text=True, check=True
            ).stdout
            ours = peers.cgroup_of(accepted.getpeername(), accepted.getsockname())
            accepted.sendall(b"bye")
        child.wait(10)
    (path,) = [word.removeprefix("cgroup:") for word in shown.split() if word.startswith("cgroup:")]
    mount = next(point for point, _root, fs, _options in cgroup._mounts() if fs == "cgroup2")
    named = os.path.join(mount, path.lstrip("/"))
    innermost = next(p for h, p in zip(cgroups.hierarchies, cgroups.paths(name), strict=True) if h.version == 2)
    assert named == innermost
    assert ours == os.stat(named).st_ino == cgroups.socket_id(name)
