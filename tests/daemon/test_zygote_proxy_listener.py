"""A zygote in proxy mode hands its egress process one listener per command, and only for
a command that started: one that failed to start would leave a listener there, served
for a call nobody ends (an fd and a task of the egress process for each failure)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest

from toold_daemon.egress.process import EgressListen
from toold_daemon.isolation import zygote
from toold_daemon.isolation.roots import roots_identity
from toold_daemon.isolation.wire import Spawned, SpawnRequest, close_fds, receive_with_fds


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    """``_start`` changes directory to the command's: keep the test's own."""
    here = os.getcwd()
    try:
        yield tmp_path
    finally:
        os.chdir(here)


def start(root: Path, argv: list[str], to_egress: socket.socket) -> tuple[Spawned, zygote.Started | None]:
    request = SpawnRequest(
        call_id="c1", token="tok-1", argv=argv, cwd=str(root), roots=[str(root)], egress_proxy=True, temp=str(root)
    )
    channel_ours, channel_theirs = socket.socketpair()
    channel_ours.close()
    fd = channel_theirs.detach()
    return zygote._start(
        msgspec.msgpack.encode(request), [fd], identity=roots_identity([str(root)]), to_egress=to_egress
    )


def test_a_command_that_does_not_start_hands_over_no_listener(in_tmp: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reply, started = start(in_tmp, [str(in_tmp / "no-such-program")], ours)
        assert started is None and "cannot start" in reply.error
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):
            theirs.recv(1)  # nothing was sent to the egress process


def test_a_started_command_hands_over_the_listener_its_environment_names(in_tmp: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reply, started = start(in_tmp, ["/bin/true"], ours)
        assert started is not None and reply.pid == started[2]
        request, channel, pid, pipes, _at = started
        try:
            received = receive_with_fds(theirs)
            assert received is not None
            body, fds = received
            listen = msgspec.msgpack.decode(body, type=EgressListen)
            assert listen.token == "tok-1" and len(fds) == 1
            with socket.socket(fileno=fds[0]) as listener:
                assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
                port = listener.getsockname()[1]
                assert request.env["HTTP_PROXY"] == f"http://127.0.0.1:{port}"
                assert request.env["all_proxy"] == f"socks5h://127.0.0.1:{port}"
        finally:
            os.waitpid(pid, 0)
            close_fds([channel, *pipes])


def test_a_listener_the_egress_process_cannot_take_ends_the_command(in_tmp: Path) -> None:
    ours, theirs = socket.socketpair()
    theirs.close()  # the egress process is gone
    with ours:
        reply, started = start(in_tmp, ["/bin/sleep", "30"], ours)
        assert started is None and "cannot start" in reply.error
    # the command that had started was ended and reaped
    assert not _children_running(["/bin/sleep", "30"])


def _children_running(command: list[str]) -> list[psutil.Process]:
    """This process's children running ``command``, unreaped ones included. A zombie's
    command line cannot be read (another test's child may be one): its name is matched."""
    found = []
    for child in psutil.Process().children():
        try:
            if child.cmdline() == command:
                found.append(child)
        except psutil.ZombieProcess:
            if child.name() == Path(command[0]).name:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found
