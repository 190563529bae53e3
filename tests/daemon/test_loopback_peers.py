"""Telling which cgroup made the other end of a loopback connection, against the real
kernel: processes moved into cgroups of their own connect to listeners here, and the
proxy serves a call's listener only for the connections its own cgroup made."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.daemon.test_egress_proxy import LOOPBACK
from tests.webserver import Server, serving
from toold_daemon.egress.peers import LoopbackPeers, open_diagnostics
from toold_daemon.egress.proxy import Connection, Proxy
from toold_daemon.egress.relay import Budget
from toold_daemon.isolation.cgroup import Cgroups

#: Moves itself into the cgroup given, connects to the port given, sends what is given
#: and prints the first reply (or nothing when the connection is closed unanswered).
_CONNECT = """
import socket, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as procs:
    procs.write("0")
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
s.sendall(sys.argv[3].encode())
s.settimeout(10)
try:
    sys.stdout.write(s.recv(65536).decode(errors="replace"))
except ConnectionResetError:
    pass
"""


def _unified_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


@pytest.fixture
def two_cgroups() -> Iterator[tuple[Path, Path]]:
    """Two fresh cgroups in the unified hierarchy, below the one this process is in."""
    mount = _unified_mount()
    if os.geteuid() != 0 or mount is None:
        pytest.skip("making cgroups in the unified hierarchy takes root and a cgroup2 mount")
    own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    parent = mount / own.lstrip("/") / f"toold-peers-{os.getpid()}"
    made = [parent / "a", parent / "b"]
    try:
        for path in (parent, *made):
            path.mkdir()
    except OSError as exc:
        pytest.skip(f"no cgroup can be made here: {exc}")
    yield made[0], made[1]
    for path in (*made, parent):
        path.rmdir()


@pytest.fixture
def peers() -> Iterator[LoopbackPeers]:
    diagnostics, why_not = open_diagnostics()
    if diagnostics is None:
        pytest.skip(why_not)
    found = LoopbackPeers(diagnostics)
    yield found
    found.close()


def test_the_cgroup_that_made_a_connection_is_told(two_cgroups: tuple[Path, Path], peers: LoopbackPeers) -> None:
    a, b = two_cgroups
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        for group in (a, b):
            child = subprocess.Popen([sys.executable, "-c", _CONNECT, str(group), str(port), "hi"])
            accepted, _ = listener.accept()
            with accepted:
                told = peers.cgroup_of(accepted.getpeername(), accepted.getsockname())
                assert told == group.stat().st_ino  # a cgroup's id is its inode number
                accepted.sendall(b"bye")
            child.wait(10)
        with socket.create_connection(("127.0.0.1", port)) as own, listener.accept()[0] as accepted:
            assert peers.cgroup_of(accepted.getpeername(), accepted.getsockname()) not in (
                a.stat().st_ino,
                b.stat().st_ino,
            )
            assert peers.cgroup_of(own.getsockname(), own.getpeername()) == peers.cgroup_of(
                accepted.getpeername(), accepted.getsockname()
            )


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
    two_cgroups: tuple[Path, Path], peers: LoopbackPeers, web: Server
) -> None:
    """Attack: a process of another cgroup (another command of the zygote) leaves a
    request in the call's listener. It is closed unanswered and recorded nowhere; the
    call's own request goes through."""
    own, other = two_cgroups
    records: list[Connection] = []

    async def decide(host: str, port: int) -> tuple[bool, str]:
        return True, "test"

    def made_in_own(connection: trio.socket.SocketType) -> bool:
        return peers.cgroup_of(connection.getpeername(), connection.getsockname()) == own.stat().st_ino

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    proxy = Proxy(decide, records.append, LOOPBACK, Budget(1 << 30), made_in_own)

    async def request(group: Path, mark: str) -> str:
        text = f"GET http://127.0.0.1:{web.port}/{mark} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        done = await trio.run_process(
            [sys.executable, "-c", _CONNECT, str(group), str(port), text], capture_stdout=True, check=True
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
