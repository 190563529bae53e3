"""The proxy's relay on real TCP connections: both ways at once, half closes, the byte
budget shared between connections, cancelling mid-transfer, and the same behaviour when
no relay thread is free (the event-loop path)."""

from __future__ import annotations

import mmap
import struct
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from toold_daemon.egress import relay as relay_module
from toold_daemon.egress.relay import Budget, relay

MB = 1024 * 1024


@asynccontextmanager
async def tcp_pair() -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """Two connected TCP streams on 127.0.0.1."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with listeners[0]:
        near = await trio.open_tcp_stream("127.0.0.1", port)
        far = await listeners[0].accept()
    async with near, far:
        yield near, far


@asynccontextmanager
async def relayed(
    budget: Budget, counted: list[tuple[bool, int]], endings: list[str]
) -> AsyncIterator[tuple[trio.SocketStream, trio.SocketStream]]:
    """(the program's end, the destination's end) with the relay between them."""
    async with (
        tcp_pair() as (program, client),
        tcp_pair() as (upstream, destination),
        trio.open_nursery() as nursery,
    ):

        async def run() -> None:
            endings.append(await relay(client, upstream, budget, lambda out, n: counted.append((out, n))))

        nursery.start_soon(run)
        yield program, destination
        nursery.cancel_scope.deadline = trio.current_time() + 10


async def send_and_close(stream: trio.SocketStream, payload: bytes) -> None:
    await stream.send_all(payload)
    await stream.send_eof()


async def send_until_cut_off(stream: trio.SocketStream, payload: bytes) -> None:
    """Send, accepting that the relay may end the connection first (a spent budget)."""
    try:
        await send_and_close(stream, payload)
    except trio.BrokenResourceError:
        pass


async def read_all(stream: trio.SocketStream, into: bytearray) -> None:
    while chunk := await stream.receive_some(256 * 1024):
        into += chunk


@pytest.fixture(params=["threads", "event loop"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def on(path: str) -> AsyncIterator[None]:
    """Run the body with relay threads available, or with every one of them taken."""
    if path == "threads":
        yield
        return
    holders = [object() for _ in range(relay_module.RELAY_THREADS)]
    for holder in holders:
        relay_module._threads.acquire_on_behalf_of_nowait(holder)
    try:
        yield
    finally:
        for holder in holders:
            relay_module._threads.release_on_behalf_of(holder)


async def test_bytes_go_both_ways_at_once_and_each_half_close_is_passed_on(path: str) -> None:
    outbound, inbound = bytes(range(256)) * 12_000, b"back" * 800_000  # ~3 MB each way
    counted: list[tuple[bool, int]] = []
    endings: list[str] = []
    got_out, got_in = bytearray(), bytearray()
    async with on(path), relayed(Budget(1 << 40), counted, endings) as (program, destination):
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_and_close, program, outbound)
                nursery.start_soon(send_and_close, destination, inbound)
                nursery.start_soon(read_all, destination, got_out)
                nursery.start_soon(read_all, program, got_in)
    assert bytes(got_out) == outbound and bytes(got_in) == inbound
    assert sum(n for out, n in counted if out) == len(outbound)
    assert sum(n for out, n in counted if not out) == len(inbound)
    assert endings == ["eof"]


async def test_the_budget_is_shared_by_connections_and_never_exceeded(path: str) -> None:
    budget = Budget(3 * MB)
    payload = b"z" * (2 * MB)
    received: list[bytearray] = [bytearray(), bytearray()]
    endings: list[str] = []
    async with on(path):
        with trio.fail_after(20):
            async with trio.open_nursery() as outer:

                async def one(index: int) -> None:
                    async with relayed(budget, [], endings) as (program, destination), trio.open_nursery() as n:
                        # the program has nothing to send: a connection whose download
                        # ends before the budget does then ends at once, not when the
                        # relay's deadline cancels it
                        await program.send_eof()
                        n.start_soon(send_until_cut_off, destination, payload)
                        n.start_soon(read_all, program, received[index])

                outer.start_soon(one, 0)
                outer.start_soon(one, 1)
    moved = len(received[0]) + len(received[1])
    assert moved <= 3 * MB
    assert moved >= 3 * MB - 2 * MB  # both moved data until the budget ran out
    assert "budget" in endings
    assert len(endings) == 2  # both relays ended on their own
    assert budget.remaining == 0


async def test_cancelling_a_relay_mid_transfer_returns_promptly_and_lets_go_of_its_threads(path: str) -> None:
    before = threading.active_count()
    async with on(path), tcp_pair() as (program, client), tcp_pair() as (upstream, destination):
        ended: list[str] = []
        with trio.move_on_after(0.3) as scope:

            async def trickle() -> None:
                while True:
                    await destination.send_all(b"x" * 4096)
                    await trio.sleep(0.01)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle)
                nursery.start_soon(read_all, program, bytearray())
                ended.append(await relay(client, upstream, Budget(1 << 40), lambda out, n: None))
        assert scope.cancelled_caught and not ended
        # the relay shut the sockets down on its way out: the program sees the end once it
        # has read what was already on its way when the cancel came
        with trio.fail_after(2):
            while await program.receive_some(65536):
                pass
    # both directions were done when the relay returned: their threads are free again
    assert relay_module._threads.borrowed_tokens == 0
    assert threading.active_count() <= before + 2


async def test_connections_one_after_another_reuse_the_relay_threads() -> None:
    """A direction's thread waits in trio's cache for the next one instead of a thread
    starting per direction: ten relays in turn run on a few threads, not twenty."""
    before = threading.active_count()
    ran_on: set[threading.Thread] = set()  # the objects themselves: no id reused

    def count(outbound: bool, moved: int) -> None:
        ran_on.add(threading.current_thread())

    async def run(endings: list[str], client: trio.SocketStream, upstream: trio.SocketStream) -> None:
        endings.append(await relay(client, upstream, Budget(1 << 40), count))

    for _ in range(10):
        endings: list[str] = []
        async with (
            tcp_pair() as (program, client),
            tcp_pair() as (upstream, destination),
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(run, endings, client, upstream)
            await destination.send_all(b"ping")
            await program.send_all(b"pong")
            assert await program.receive_some(4) == b"ping"
            assert await destination.receive_some(4) == b"pong"
            await program.send_eof()
            await destination.send_eof()
        assert endings == ["eof"]
        assert threading.active_count() <= before + 2
    assert len(ran_on) <= 4
    assert relay_module._threads.borrowed_tokens == 0


async def test_a_broken_side_ends_both_directions(path: str) -> None:
    endings: list[str] = []
    async with on(path), relayed(Budget(1 << 40), [], endings) as (program, destination):
        await destination.send_all(b"hello")
        assert await program.receive_some(5) == b"hello"
        reset_on_close = struct.pack("ii", 1, 0)
        destination.socket.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, reset_on_close)
        await destination.aclose()  # a reset, not an orderly end
        with trio.fail_after(5):
            while True:
                try:
                    if not await program.receive_some(1024):
                        break
                except trio.BrokenResourceError:
                    break
    assert endings == ["broken"]


def test_a_thread_refused_its_buffer_mapping_relays_through_a_small_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> None:
        raise OSError(12, "Cannot allocate memory")  # as under the process's address-space limit

    monkeypatch.setattr(mmap, "mmap", refused)
    sizes: list[int] = []
    thread = threading.Thread(target=lambda: sizes.append(len(relay_module._thread_buffer())))  # a thread with none yet
    thread.start()
    thread.join()
    assert sizes == [64 * 1024]


def test_a_thread_keeps_its_buffer_for_the_next_direction() -> None:
    kept: list[bool] = []
    thread = threading.Thread(
        target=lambda: kept.append(relay_module._thread_buffer() is relay_module._thread_buffer())
    )
    thread.start()
    thread.join()
    assert kept == [True] and len(relay_module._thread_buffer()) == relay_module.THREAD_BUFFER_BYTES
