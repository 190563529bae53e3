"""Frames between the daemon and its zygotes and workers (``isolation.sockets``), over real
socket pairs: read without a trip through the event loop when the bytes are there, but a
frame that comes in pieces is still waited for whole, a length past the bound is a broken
peer (not four gigabytes to wait for), and a send that finds the socket full waits its
turn with its fd still attached."""

from __future__ import annotations

import array
import os
import socket
import threading

import msgspec
import pytest
import trio

from toold_daemon.isolation.sockets import PeerGone, receive_frame, send_with_fd
from toold_daemon.isolation.wire import MAX_FRAME, receive_with_fds


def _turn_frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


async def test_a_frame_that_comes_in_pieces_is_received_whole() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sock = trio.socket.from_stdlib_socket(ours)
        body = b"x" * 5000
        received: list[bytes] = []

        async def receive() -> None:
            received.append(await receive_frame(sock))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for piece in (len(body).to_bytes(4, "big")[:2], len(body).to_bytes(4, "big")[2:], body[:100], body[100:]):
                await trio.sleep(0.02)
                assert not received  # still waiting for the rest
                theirs.sendall(piece)
        assert received == [body]


@pytest.mark.parametrize("size", [MAX_FRAME + 1, 2**32 - 1])
async def test_a_length_past_the_bound_is_a_broken_peer(size: int) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(size.to_bytes(4, "big") + b"tail")
        with trio.fail_after(2), pytest.raises(PeerGone, match="frame of"):
            await receive_frame(trio.socket.from_stdlib_socket(ours))


async def test_a_peer_that_closes_mid_frame_is_gone() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        theirs.sendall((100).to_bytes(4, "big") + b"partial")
        theirs.close()
        with trio.fail_after(2), pytest.raises(PeerGone):
            await receive_frame(trio.socket.from_stdlib_socket(ours))


async def test_a_send_that_finds_the_socket_full_waits_and_keeps_its_fd() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sock = trio.socket.from_stdlib_socket(ours)
        filler = b"f" * 65536
        while True:  # fill the socket until a send would block
            try:
                ours.send(filler)
            except BlockingIOError:
                break
        read_end, write_end = os.pipe()
        try:
            sent = trio.Event()

            async def send() -> None:
                await send_with_fd(sock, (4).to_bytes(4, "big") + b"body", write_end)
                sent.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                await trio.sleep(0.05)
                assert not sent.is_set()  # waiting for room, not failed
                theirs.setblocking(False)
                got = b""
                fds: list[int] = []
                while not sent.is_set() or not got.endswith(b"body"):
                    try:
                        data, ancillary, _flags, _addr = theirs.recvmsg(65536, socket.CMSG_SPACE(4))
                    except BlockingIOError:
                        await trio.sleep(0.005)
                        continue
                    got += data
                    for _level, _kind, payload in ancillary:
                        fds.extend(array.array("i", payload))
            assert got.endswith((4).to_bytes(4, "big") + b"body")
            (passed,) = fds
            os.write(passed, b"through the passed fd")
            os.close(passed)
            assert os.read(read_end, 100) == b"through the passed fd"
        finally:
            os.close(read_end)
            os.close(write_end)


@pytest.mark.parametrize("alone", [False, True])
async def test_a_frame_and_its_fd_reach_the_other_side(alone: bool) -> None:
    """A zygote's frames, and a worker's (``alone``: its peer takes turns)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        read_end, write_end = os.pipe()
        try:
            await send_with_fd(trio.socket.from_stdlib_socket(ours), _turn_frame(b"hi"), write_end)
            received = receive_with_fds(theirs, alone=alone)
            assert received is not None
            body, (passed,) = received
            assert body == b"hi"
            os.close(passed)
        finally:
            os.close(read_end)
            os.close(write_end)


def test_a_large_frame_is_built_and_decoded_without_copies_beside_it() -> None:
    """An undo's request and a delete's outcome carry up to the undo bound (64 MiB): each
    copy of one held the loop, and every other client, for about 50 ms. A frame is now
    encoded behind its header in one buffer, and decoded where it lies."""
    import tracemalloc

    from toold_daemon.isolation.wire import FrameBuffer, Outcome, child_decoder, frame

    data = os.urandom(20 << 20)
    message = Outcome(ok=True, content="c", data={"blob": data})
    built = frame(message)
    assert bytes(built[4:]) == msgspec.msgpack.encode(message) and int.from_bytes(built[:4], "big") == len(built) - 4
    buffer = FrameBuffer(64 << 20)
    buffer.add(bytes(built[:1000]))
    assert buffer.decode_next(child_decoder) is None  # (not all here yet)
    buffer.add(bytes(built[1000:]) + bytes(frame(Outcome(ok=False))))
    del built
    tracemalloc.start()
    try:
        decoded = buffer.decode_next(child_decoder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(decoded, Outcome) and decoded.data == {"blob": data}
    assert peak < 1.5 * len(data)  # the decoded bytes alone, not a copy of the frame as well
    assert buffer.decode_next(child_decoder) == Outcome(ok=False)  # the next frame is still there


@pytest.mark.parametrize("length", [0, 1, 300, 64 * 1024, 200_000])
def test_a_peer_that_takes_turns_sends_a_frame_whole_or_in_pieces_and_it_comes_whole(length: int) -> None:
    """A worker reads its daemon's request with one read when it is all there (``alone``):
    a small frame whole, a large one (or one sent in pieces) waited for to its end."""
    body = os.urandom(length)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(_turn_frame(body))
        assert receive_with_fds(theirs, alone=True) == (body, [])
        data = _turn_frame(body)
        cut = len(data) // 2 or 1
        ours.sendall(data[:cut])

        def rest() -> None:
            ours.sendall(data[cut:])

        sender = threading.Thread(target=rest)
        sender.start()
        try:
            assert receive_with_fds(theirs, alone=True) == (body, [])
        finally:
            sender.join()


def test_a_peer_that_takes_turns_and_sends_past_its_frame_is_broken() -> None:
    """Bytes after the frame would be read as part of it, then lost: a peer that does not
    wait for its answer is refused, never half-read."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(_turn_frame(b"first") + _turn_frame(b"second"))
        with pytest.raises(ValueError, match="past the frame"):
            receive_with_fds(theirs, alone=True)


def test_a_peer_that_takes_turns_and_closes_mid_frame_is_gone() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        ours.sendall((100).to_bytes(4, "big") + b"partial")
        ours.close()
        assert receive_with_fds(theirs, alone=True) is None


def test_a_frame_past_the_bound_from_a_peer_that_takes_turns_is_refused() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall((1000).to_bytes(4, "big") + b"x" * 1000)
        with pytest.raises(ValueError, match="over the limit"):
            receive_with_fds(theirs, limit=999, alone=True)


def test_a_whole_frame_from_a_peer_that_takes_turns_takes_one_read(reads: list[int]) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(_turn_frame(b"r" * 432))
        assert receive_with_fds(theirs, alone=True) == (b"r" * 432, [])
        assert reads == []  # the header's read took the body too
        ours.sendall(_turn_frame(b"r" * 432))
        assert receive_with_fds(theirs) == (b"r" * 432, [])  # (not alone: the body's own read)
        assert reads == [432]
