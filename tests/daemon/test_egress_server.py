"""The egress process's server on real sockets: a listener handed over as the zygote
hands it, a real destination on 127.0.0.1, and the runner's link read frame by frame.

What it must keep when a call is forgotten: every connection's record reaches the runner
before ``EgressForgotten``, and after it the call's listener takes no more connections;
a connection still open is ended first, never left running past its call."""

from __future__ import annotations

import functools
import gc
import socket
from typing import Any

import msgspec
import pytest
import trio

from toold_daemon.egress.process import (
    EgressAnswer,
    EgressForget,
    EgressForgotten,
    EgressListen,
    EgressRecord,
    EgressServer,
    EgressUsed,
    _Call,
    to_runner,
)
from toold_daemon.egress.proxy import Proxy
from toold_daemon.egress.rules import EgressRules
from toold_daemon.isolation.wire import FrameBuffer, frame

pytestmark = pytest.mark.trio
TOKEN = "call-under-test"


class RunnerEnd:
    """The protocol process's end of the link, reading what the egress process says and
    answering a call's first connection (``EgressUsed``) as the runner does while the
    call runs: yes, unless told the call is over (``ended``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = trio.socket.from_stdlib_socket(sock)
        self.ended: set[str] = set()
        self._sent, self._received = trio.open_memory_channel[msgspec.Struct](1000)

    async def serve(self) -> None:
        buffer = FrameBuffer()
        while data := await self.sock.recv(65536):
            for body in buffer.feed(data):
                message = to_runner.decode(body)
                if isinstance(message, EgressUsed):
                    running = message.token not in self.ended
                    await self.send(EgressAnswer(id=message.id, allowed=running, why="" if running else "over"))
                await self._sent.send(message)
        self._sent.close()

    async def send(self, message: msgspec.Struct) -> None:
        await self.sock.send(frame(message))

    def pending_now(self) -> list[msgspec.Struct]:
        """What has been said and not taken yet, without waiting."""
        pending = []
        while True:
            try:
                pending.append(self._received.receive_nowait())
            except trio.WouldBlock:
                return pending

    async def next(self) -> msgspec.Struct:
        try:
            return await self._received.receive()
        except trio.EndOfChannel:
            raise AssertionError("the egress process closed its link") from None

    async def until_forgotten(self) -> list[msgspec.Struct]:
        seen = []
        while not isinstance(message := await self.next(), EgressForgotten):
            seen.append(message)
        return seen


async def echo_server(nursery: trio.Nursery) -> int:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


async def started_server(
    nursery: trio.Nursery,
    port: int,
    before: tuple[str, socket.socket] | None = None,
    *,
    zygote_leaves: bool = False,
    ended: trio.Event | None = None,
    zygote_end: list[socket.socket] | None = None,
) -> tuple[RunnerEnd, int]:
    """An egress server allowing 127.0.0.1:port, with one call's listener: (runner end, proxy
    port); ``before``: a call's token and socket handed over first, as they are;
    ``zygote_leaves``: the zygote's end closes once the listener is handed over (a
    fresh child's command); ``ended``: set when the server returns; ``zygote_end``: given
    the zygote's end (to close when the test says)."""
    zygote_ours, zygote_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runner_ours, runner_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    zygote_theirs.setblocking(False)
    rules = EgressRules.of(allowed_domains=["127.0.0.1"], allowed_ports=[port], allowed_networks=["127.0.0.1/32"])

    async def run() -> None:
        await EgressServer(zygote_theirs, runner_theirs, rules).run()
        if ended is not None:
            ended.set()

    nursery.start_soon(run)
    if before is not None:
        socket.send_fds(zygote_ours, [frame(EgressListen(token=before[0], budget=1 << 30))], [before[1].fileno()])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        proxy_port = listener.getsockname()[1]
        socket.send_fds(zygote_ours, [frame(EgressListen(token=TOKEN, budget=1 << 30))], [listener.fileno()])
    if zygote_leaves:
        zygote_ours.close()
    elif zygote_end is not None:
        zygote_end.append(zygote_ours)
    else:
        nursery.start_soon(_hold_open, zygote_ours)
    runner = RunnerEnd(runner_ours)
    nursery.start_soon(runner.serve)
    return runner, proxy_port


async def _hold_open(sock: socket.socket) -> None:
    try:
        await trio.sleep_forever()
    finally:
        sock.close()


async def echoed(proxy_port: int, port: int, payload: bytes) -> trio.SocketStream:
    """A tunnel to the echo server that has carried ``payload`` there and back."""
    stream = await tunnel(proxy_port, port)
    await stream.send_all(payload)
    assert await stream.receive_some(100) == payload
    return stream


def traffic(seen: list[msgspec.Struct]) -> list[tuple[int, int]]:
    """Bytes (sent, received) of each connection recorded among ``seen``, in order."""
    return [(m.sent, m.received) for m in seen if isinstance(m, EgressRecord)]


async def tunnel(proxy_port: int, port: int) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", proxy_port)
    await stream.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some(1024)
    assert head.startswith(b"HTTP/1.1 200"), head
    return stream


async def test_a_call_forgotten_after_its_connections_ended_hands_over_every_record_first() -> None:
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port)
        for payload in (b"one", b"second"):
            stream = await echoed(proxy_port, port, payload)
            await stream.aclose()
        seen: list[msgspec.Struct] = []
        while sum(isinstance(m, EgressRecord) for m in seen) < 2:
            seen.append(await runner.next())  # both connections are over and recorded
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            seen += await runner.until_forgotten()
        assert isinstance(seen[0], EgressUsed)
        records = [m for m in seen if isinstance(m, EgressRecord)]
        # (each connection records itself when its end is noticed: in either order)
        assert sorted(traffic(seen)) == [(3, 3), (6, 6)]
        assert all(r.host == "127.0.0.1" and r.port == port and not r.refused for r in records)
        with trio.fail_after(5):  # the listener went with the call
            with pytest.raises(OSError):
                await tunnel(proxy_port, port)
        nursery.cancel_scope.cancel()


async def test_a_call_forgotten_with_a_connection_open_ends_it_and_records_it_before_answering() -> None:
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port)
        stream = await echoed(proxy_port, port, b"still talking")
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            seen = await runner.until_forgotten()
            assert await _read_to_end(stream) == b""  # the proxy ended the tunnel
        assert traffic(seen) == [(13, 13)], seen
        nursery.cancel_scope.cancel()


async def test_forgetting_a_call_that_never_connected_is_answered() -> None:
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port)
        await trio.sleep(0.05)  # the listener has been taken
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            assert await runner.until_forgotten() == []
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", proxy_port)
        nursery.cancel_scope.cancel()


async def _read_to_end(stream: trio.SocketStream) -> bytes:
    rest = b""
    try:
        while data := await stream.receive_some(65536):
            rest += data
    except trio.BrokenResourceError:
        pass
    return rest


@pytest.mark.parametrize("how", ["never listening", "shut down after the hand-over"])
async def test_a_call_whose_listener_fails_ends_alone(how: str) -> None:
    """A socket that cannot accept ends that call's proxy, not the egress process: the
    other calls go on, and the broken call is forgotten."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as broken:
        broken.bind(("127.0.0.1", 0))
        if how != "never listening":
            broken.listen(8)
        async with trio.open_nursery() as nursery:
            port = await echo_server(nursery)
            runner, proxy_port = await started_server(nursery, port, before=("broken", broken))
            if how != "never listening":
                broken.shutdown(socket.SHUT_RDWR)  # the egress process's accept now fails
            await trio.sleep(0.05)
            stream = await echoed(proxy_port, port, b"ping")
            await stream.aclose()
            await runner.send(EgressForget(token="broken"))
            with trio.fail_after(5):
                while not isinstance(message := await runner.next(), EgressForgotten):
                    pass
            assert message.token == "broken"
            nursery.cancel_scope.cancel()


async def test_with_its_zygote_gone_the_egress_process_serves_its_calls_until_they_are_forgotten() -> None:
    """A fresh child hands over its command's listener and closes its end; the child then
    waits for the egress process to end before it exits (its egress process dies with it).
    The egress process must serve the call, hand over its records when the call is
    forgotten, and only then end."""
    ended = trio.Event()
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port, zygote_leaves=True, ended=ended)
        await trio.sleep(0.05)
        assert not ended.is_set()
        stream = await echoed(proxy_port, port, b"last words")
        await stream.aclose()
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            seen = await runner.until_forgotten()
            await ended.wait()
        assert traffic(seen) == [(10, 10)]
        nursery.cancel_scope.cancel()


async def test_a_host_name_of_any_length_is_recorded_cut_to_fit() -> None:
    """What a command writes as the host goes into the record: a very long one is cut to
    the bounds the runner holds records to, not sent whole (the runner would take it for
    garbage and close the link, losing every other record)."""
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        await stream.send_all(b"CONNECT " + b"a" * 20_000 + b".example:443 HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            assert (await stream.receive_some(1024)).startswith(b"HTTP/1.1 4")
        await stream.aclose()
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            seen = await runner.until_forgotten()
        (record,) = [m for m in seen if isinstance(m, EgressRecord)]
        assert record.refused and len(record.host) == 256 and record.host.endswith("…")
        nursery.cancel_scope.cancel()


async def test_a_first_connection_the_runner_says_is_too_late_goes_nowhere() -> None:
    """The runner answers "no" to a call's first connection once it has taken the call for
    one without connections: the proxy refuses it, and nothing reaches the destination."""
    reached: list[bytes] = []

    async def note(stream: trio.SocketStream) -> None:
        async with stream:
            reached.append(await stream.receive_some(100))

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(functools.partial(trio.serve_tcp, note, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        runner, proxy_port = await started_server(nursery, port)
        runner.ended.add(TOKEN)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        await stream.send_all(f"GET http://127.0.0.1:{port}/secret HTTP/1.0\r\n\r\n".encode())
        with trio.fail_after(5):
            assert (await _read_to_end(stream)).startswith(b"HTTP/1.1 403")
        await trio.sleep(0.1)
        assert reached == []
        nursery.cancel_scope.cancel()


async def test_a_listener_that_comes_after_its_call_was_forgotten_is_closed_unserved() -> None:
    """The zygote's hand-over and the runner's forget come on different sockets: a command
    that ended at once can be forgotten before its listener arrives. What waits in that
    listener's backlog must go nowhere (it would be in no result)."""
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        zygote: list[socket.socket] = []
        runner, _ = await started_server(nursery, port, zygote_end=zygote)
        await runner.send(EgressForget(token="gone-early"))
        with trio.fail_after(5):
            assert await runner.until_forgotten() == []
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as late:
            late.bind(("127.0.0.1", 0))
            late.listen(8)
            waiting = socket.create_connection(late.getsockname())  # in the backlog already
            waiting.sendall(f"GET http://127.0.0.1:{port}/ HTTP/1.0\r\n\r\n".encode())
            socket.send_fds(zygote[0], [frame(EgressListen(token="gone-early", budget=1 << 30))], [late.fileno()])
        with trio.fail_after(5):
            waiting.setblocking(False)
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(waiting))
            assert await _read_to_end(stream) == b""  # closed unserved: no answer, no 200
        await trio.sleep(0.1)
        assert not runner.pending_now(), "nothing was said about the late call"
        nursery.cancel_scope.cancel()


async def test_a_call_forgotten_as_its_zygote_goes_still_hands_over_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh child's egress process ends once its starter is gone and it knows no call.
    The starter going while a forget is still on its way (here: just before the records
    go out) must not end it before the records and the answer are out."""
    zygote: list[socket.socket] = []
    flush = EgressServer._flush

    async def starter_leaves_first(self: EgressServer, call: Any) -> None:
        if zygote:
            zygote.pop().close()
            await trio.sleep(0.05)  # the egress process has seen its starter go
        await flush(self, call)

    monkeypatch.setattr(EgressServer, "_flush", starter_leaves_first)
    ended = trio.Event()
    async with trio.open_nursery() as nursery:
        port = await echo_server(nursery)
        runner, proxy_port = await started_server(nursery, port, ended=ended, zygote_end=zygote)
        _still_open = await echoed(proxy_port, port, b"open")
        await runner.send(EgressForget(token=TOKEN))
        with trio.fail_after(5):
            seen = await runner.until_forgotten()
            await ended.wait()
        assert traffic(seen) == [(4, 4)]
        nursery.cancel_scope.cancel()


async def test_a_forgotten_call_leaves_no_reference_cycle_for_the_collector() -> None:
    """Its proxy's closures hold the call; the call must not hold the proxy once it is
    over, or each proxied command would leave a cycle only the garbage collector frees.
    (The first of two calls: the server's loop keeps its last call at hand.)"""
    gc.collect()
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            port = await echo_server(nursery)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
                first.bind(("127.0.0.1", 0))
                first.listen(8)
                runner, _proxy_port = await started_server(nursery, port, before=("first", first))
            await runner.send(EgressForget(token="first"))
            with trio.fail_after(5):
                await runner.until_forgotten()
            await trio.sleep(0.1)  # the cancelled proxy has wound down
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left = [type(thing).__name__ for thing in gc.garbage if isinstance(thing, (_Call, Proxy))]
            nursery.cancel_scope.cancel()
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    assert left == []
