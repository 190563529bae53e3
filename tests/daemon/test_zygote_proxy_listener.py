"""A zygote in proxy mode gives each command a listener of its own, and hands it to its
egress process only once a connection waits on it: a command that never connects costs
the egress process nothing (before, every command's listener went over at its start,
and each took a task there and a forget from the runner). A command that did not start
never hands one over (it would stay open there, served for a call nobody ends).

Real commands, a real ``Supervisor``, a socket pair as the link to the egress process."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from toold_daemon.egress.process import EgressListen
from toold_daemon.isolation import zygote
from toold_daemon.isolation.roots import roots_identity
from toold_daemon.isolation.supervisor import Supervisor
from toold_daemon.isolation.wire import ChildMessage, Outcome, Spawned, SpawnRequest, receive_with_fds


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    """``_start`` changes directory to the command's: keep the test's own."""
    here = os.getcwd()
    try:
        yield tmp_path
    finally:
        os.chdir(here)


Link = tuple[socket.socket, socket.socket]


@pytest.fixture
def link() -> Iterator[Link]:
    """(the zygote's end, the egress process's end)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.setblocking(False)
        yield ours, theirs


def start(
    root: Path, argv: list[str], to_egress: socket.socket | zygote.NextListener
) -> tuple[Spawned, zygote.Started | None, socket.socket]:
    """Start ``argv`` as the zygote does, with a listener made then or (given a
    ``NextListener``) ahead: (its reply, what it watches, the channel's reading end)."""
    request = SpawnRequest(
        call_id="c1", token="tok-1", argv=argv, cwd=str(root), roots=[str(root)], egress_proxy=True, temp=str(root),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )  # fmt: skip
    channel_ours, channel_theirs = socket.socketpair()
    fd = channel_theirs.detach()
    proxied = to_egress if isinstance(to_egress, zygote.NextListener) else zygote.NextListener(to_egress)
    reply, started = zygote._start(
        msgspec.msgpack.encode(request), [fd], identity=roots_identity([str(root)]), proxied=proxied
    )
    return reply, started, channel_ours


def supervise(started: zygote.Started, channel: socket.socket) -> Outcome:
    """Watch the command to its end as the zygote does; its outcome."""
    supervisor = Supervisor({})
    request, channel_fd, pid, pipes, at, listener = started
    supervisor.add(request, channel_fd, pid, pipes, at, listener=listener)
    deadline = time.monotonic() + 20
    while supervisor.active:
        assert time.monotonic() < deadline
        supervisor.step(max_wait=0.1)
    data = b""
    with channel:
        while piece := channel.recv(65536):
            data += piece
    decoder = msgspec.msgpack.Decoder(ChildMessage)
    messages, view = [], memoryview(data)
    while view:
        size = int.from_bytes(view[:4], "big")
        messages.append(decoder.decode(view[4 : 4 + size]))
        view = view[4 + size :]
    outcome = messages[-1]
    assert isinstance(outcome, Outcome)
    return outcome


def handed_over(theirs: socket.socket) -> list[tuple[EgressListen, socket.socket]]:
    """Every listener the zygote has handed to the egress process so far."""
    found = []
    while True:
        try:
            received = receive_with_fds(theirs)
        except BlockingIOError:
            return found
        assert received is not None
        body, fds = received
        assert len(fds) == 1
        found.append((msgspec.msgpack.decode(body, type=EgressListen), socket.socket(fileno=fds[0])))


def _proxy_port(started: zygote.Started) -> int:
    listener = started[5]
    assert listener is not None
    with socket.socket(fileno=os.dup(listener.fileno())) as held:
        return int(held.getsockname()[1])


def test_a_command_that_does_not_start_hands_over_no_listener(in_tmp: Path, link: Link) -> None:
    ours, theirs = link
    reply, started, channel = start(in_tmp, [str(in_tmp / "no-such-program")], ours)
    channel.close()
    assert started is None and "cannot start" in reply.error
    assert handed_over(theirs) == []


def test_a_command_that_never_connects_hands_over_nothing(in_tmp: Path, link: Link) -> None:
    ours, theirs = link
    reply, started, channel = start(in_tmp, ["/bin/true"], ours)
    assert started is not None and reply.pid == started[2]
    port = _proxy_port(started)
    outcome = supervise(started, channel)
    assert outcome.ok and outcome.unconnected  # the runner has nothing to end there
    assert handed_over(theirs) == []
    with pytest.raises(ConnectionRefusedError):  # the listener is closed, not left open
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


#: Connects to the proxy its environment names, says so, and (unless told to wait for an
#: answer) exits at once: its connection may still wait in the listener's backlog.
_CONNECT = """
import os, socket, sys
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(b"CONNECT example.org:443 HTTP/1.1\\r\\n\\r\\n")
print("connected", flush=True)
if sys.argv[1] == "wait":
    print("answer", s.recv(100), flush=True)
"""


@pytest.mark.parametrize("then", ["exit", "wait"])
def test_a_command_that_connects_hands_over_the_listener_its_environment_names(
    in_tmp: Path, link: Link, then: str
) -> None:
    """Whether the command waits on its connection or exits right after making it (the
    connection then waits in the backlog as the command ends), the listener, with the
    connection in it, goes to the egress process before the outcome."""
    ours, theirs = link
    _reply, started, channel = start(in_tmp, [sys.executable, "-c", _CONNECT, then], ours)
    assert started is not None
    port = _proxy_port(started)
    if then == "wait":  # play the egress process: answer the one connection it was given
        deadline = time.monotonic() + 10
        supervisor = Supervisor({})
        request, channel_fd, pid, pipes, at, listener = started
        supervisor.add(request, channel_fd, pid, pipes, at, listener=listener)
        while not (given := handed_over(theirs)):
            assert time.monotonic() < deadline
            supervisor.step(max_wait=0.05)
        connection, _ = given[0][1].accept()
        with connection:
            connection.sendall(b"HTTP/1.1 403 no\r\n\r\n")
        while supervisor.active:
            assert time.monotonic() < deadline
            supervisor.step(max_wait=0.05)
        channel.close()
    else:
        outcome = supervise(started, channel)
        assert outcome.ok and not outcome.unconnected
        given = handed_over(theirs)
    (listen, listener_socket), *more = given
    assert more == []
    with listener_socket:
        assert listen.token == "tok-1"
        assert listener_socket.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert listener_socket.getsockname()[1] == port  # the one its environment named
        if then == "exit":
            listener_socket.setblocking(False)
            connection, _ = listener_socket.accept()  # what the command sent waits there
            with connection:
                assert connection.recv(100).startswith(b"CONNECT example.org:443")


#: Connects, waits until that connection ends (its listener closed under it), connects again.
_CONNECT_TWICE = """
import os, socket
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
try:  # reset at once, or once the listener is closed under it: no way out either way
    socket.create_connection(("127.0.0.1", port), timeout=10).recv(100)
except OSError:
    pass
print("first ended", flush=True)
try:
    socket.create_connection(("127.0.0.1", port), timeout=5)
except OSError as e:
    print("then", type(e).__name__)
"""


def test_a_listener_the_egress_process_cannot_take_leaves_the_command_no_way_out(in_tmp: Path) -> None:
    """The egress process is gone: the listener is closed when a connection comes, the
    command's connections are refused, and the command itself goes on to its outcome."""
    ours, theirs = socket.socketpair()
    theirs.close()
    with ours:
        _reply, started, channel = start(in_tmp, [sys.executable, "-c", _CONNECT_TWICE], ours)
        assert started is not None
        outcome = supervise(started, channel)
    assert outcome.ok, outcome.content
    assert "first ended\nthen ConnectionRefusedError" in outcome.content
    assert outcome.unconnected  # nothing went over: nothing to end there


_SAYS_ITS_PROXY = "echo $HTTP_PROXY $all_proxy"


def test_a_listener_made_ahead_refuses_connections_until_its_command_starts(in_tmp: Path, link: Link) -> None:
    """The zygote makes the next command's listener while it waits for that command. Until
    the command starts it is bound but does not listen: another command of the zygote's,
    sharing its loopback, cannot leave a connection in it to be served as the next
    command's, under that call's egress rules and answers. Then it serves that command,
    whose environment names it."""
    ours, theirs = link
    ahead = zygote.NextListener(ours)
    ahead.prepare()
    assert ahead._next is not None
    port = int(ahead._next.environment["HTTP_PROXY"].rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    _reply, started, channel = start(in_tmp, ["/bin/sh", "-c", _SAYS_ITS_PROXY], ahead)
    assert started is not None and ahead._next is None  # taken by this command
    assert _proxy_port(started) == port
    outcome = supervise(started, channel)
    assert outcome.ok
    assert f"http://127.0.0.1:{port} socks5h://127.0.0.1:{port}" in outcome.content
    assert handed_over(theirs) == []
    ahead.prepare()  # the next one: another port, not listening either
    assert ahead._next is not None
    following = int(ahead._next.environment["HTTP_PROXY"].rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", following), timeout=5).close()
    ahead.close()
