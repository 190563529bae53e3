"""A client that cannot reach the daemon says why within a second, where ZeroMQ alone
would retry in silence until the request timed out: no socket, nobody listening, no
permission (a real daemon's 0600 socket, as another user), refused by authentication (a
real ZeroMQ peer whose ZAP handler turns everyone away); and a connected client whose
daemon went away since its last call, at the next."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from tests.conftest import BIN, reachable_daemon, start_daemon
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser
from toold_client import Client, DaemonUnavailable, Refused


def failure(endpoint: str) -> tuple[str, float]:
    """The error a ping gets, and how long it took to come."""
    started = time.monotonic()
    try:
        with Client(endpoint, timeout=30) as c:
            c.ping(timeout=30)
    except DaemonUnavailable as exc:
        return str(exc), time.monotonic() - started
    raise AssertionError("the ping succeeded")


def test_no_socket(tmp_path: Path) -> None:
    message, took = failure(f"ipc://{tmp_path}/none.sock")
    assert "no daemon socket" in message and took < 1


def test_a_socket_nobody_listens_on(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()  # the file stays, as after a daemon killed with SIGKILL
    message, took = failure(f"ipc://{path}")
    assert "no daemon is listening" in message and took < 1


def test_permission_denied_on_the_daemons_socket(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path, open_socket=False) as d:
        os.chmod(d.socket.parent, 0o711)  # the directory may be passed, the socket stays 0600

        def attempt() -> None:
            print(json.dumps(failure(d.endpoint)), flush=True)

        other = OtherUser(attempt)
        try:
            message, took = json.loads(other.line())
        finally:
            other.kill()
    assert "permission denied" in message and took < 1, message


@contextmanager
def zap_peer(
    endpoint: str, serve: Callable[[zmq.Socket[bytes], zmq.Socket[bytes]], None], **options: int
) -> Iterator[str]:
    """A ZeroMQ ROUTER at ``endpoint`` with a ZAP handler bound, both served by
    ``serve(zap, router)`` on a thread, called again and again until the block ends."""
    ctx = zmq.Context()
    zap = ctx.socket(zmq.REP)
    zap.bind("inproc://zeromq.zap.01")
    router = ctx.socket(zmq.ROUTER)
    router.zap_domain = b"toold"
    for option, value in options.items():
        router.setsockopt(getattr(zmq, option), value)
    router.bind(endpoint)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            serve(zap, router)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join()
        router.close(0)
        zap.close(0)
        ctx.term()


@pytest.fixture
def refusing_peer(tmp_path: Path) -> Iterator[str]:
    """A ZeroMQ ROUTER whose ZAP handler refuses every peer, as the daemon's refuses a
    tool process."""

    def refuse(zap: zmq.Socket[bytes], router: zmq.Socket[bytes]) -> None:
        if zap.poll(50):
            request = zap.recv_multipart()
            zap.send_multipart([request[0], request[1], b"400", b"not you", b"", b""])

    with zap_peer(f"ipc://{tmp_path}/refusing.sock", refuse) as endpoint:
        yield endpoint


@pytest.fixture
def slow_to_admit_peer(tmp_path: Path) -> Iterator[str]:
    """A ZeroMQ ROUTER that answers pings, but whose ZAP handler first stalls for 1.5 s
    (as a daemon's event loop held by one long call would), with a handshake time of
    0.3 s: the first handshakes end unfinished, closed by the peer, until it admits."""
    import toold_protocol as p

    stalled_until = time.monotonic() + 1.5

    def admit_late(zap: zmq.Socket[bytes], router: zmq.Socket[bytes]) -> None:
        if zap.poll(10) and time.monotonic() > stalled_until:
            request = zap.recv_multipart()
            zap.send_multipart([request[0], request[1], b"200", b"OK", b"", b""])
        if router.poll(10):
            peer, frame = router.recv_multipart()
            message = p.decode_client_message(frame)
            assert isinstance(message, p.Ping)
            router.send_multipart([peer, p.encode(p.Pong(id=message.id))])

    with zap_peer(f"ipc://{tmp_path}/slow.sock", admit_late, HANDSHAKE_IVL=300) as endpoint:
        yield endpoint


def test_a_daemon_too_busy_to_admit_a_client_at_once_is_waited_for_not_called_a_refusal(
    slow_to_admit_peer: str,
) -> None:
    """A handshake the daemon closed unfinished (its loop busy past the handshake time)
    was read as a refusal: Refused, for good, though the next try was admitted."""
    with Client(slow_to_admit_peer, timeout=10) as client:
        assert client.ping(timeout=10) < 5


def test_refused_by_the_daemons_authentication(refusing_peer: str) -> None:
    message, took = failure(refusing_peer)
    assert "refused this client" in message and took < 1.5, message


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_daemon_gone_since_the_last_call_is_reported_at_the_next(tmp_path: Path, how: signal.Signals) -> None:
    """The daemon stops between two calls (its socket removed, or left behind by a kill):
    the next call says so at once, where it waited out its whole timeout before."""
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root)
    try:
        with Client(d.endpoint, timeout=30) as c:
            c.ping()
            d.stop(how)
            time.sleep(0.2)  # the connection's end reaches the client
            started = time.monotonic()
            with pytest.raises(DaemonUnavailable, match="no daemon") as raised:
                c.call("read_file", {"path": "x.txt"})
            took = time.monotonic() - started
    finally:
        d.stop()
    assert took < 1, (took, str(raised.value))


def test_a_daemon_restarted_on_the_same_socket_serves_the_clients_next_call(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "x.txt").write_text("still served\n")
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = start_daemon(tmp_path / "first", root, socket_dir=tmp_path / "run")
    second = None
    try:
        with Client(first.endpoint, timeout=30) as c:
            c.ping()
            first.stop()
            time.sleep(0.2)
            second = start_daemon(tmp_path / "second", root, socket_dir=tmp_path / "run")
            result = c.call("read_file", {"path": "x.txt"})
            assert result.ok and result.content == "still served\n", result
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:1", "foo"])
def test_an_endpoint_no_daemon_can_serve_is_refused_at_once(endpoint: str) -> None:
    """toold serves only Unix sockets: a TCP address would be retried in silence by
    ZeroMQ until the request timed out (30 s)."""
    message, took = failure(endpoint)
    assert "serves only ipc://" in message and took < 1, message


def test_a_refused_client_is_told_at_once_and_ping_wait_stops_there(refusing_peer: str) -> None:
    """A refusal is for good: ``Refused``, and ``toolctl ping --wait`` gives up at once
    instead of making a new client every 50 ms until its wait is over."""
    with pytest.raises(Refused), Client(refusing_peer, timeout=5) as client:
        client.ping(timeout=5)
    started = time.monotonic()
    done = subprocess.run(
        [str(BIN / "toolctl"), "--endpoint", refusing_peer, "ping", "--wait", "10"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode == 2 and "refused this client" in done.stderr, done.stderr
    assert took < 3, took  # (a toolctl start is ~0.2 s; the wait was 10 s)
