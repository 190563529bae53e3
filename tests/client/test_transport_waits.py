"""How ``ZmqTransport.recv`` waits: asleep on libzmq's descriptors, which are
edge-triggered. A frame announced by an edge that something else took (a send, which
lets libzmq process its commands) must still be returned at once, not when the timeout
ends; a wake from another thread ends the wait; a timeout is kept.

A real ROUTER on an ipc socket, served by a thread that echoes each frame back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from toold_client._transport import ZmqTransport


@contextmanager
def echoing(tmp_path: Path) -> Iterator[str]:
    endpoint = f"ipc://{tmp_path}/echo.sock"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind(endpoint)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if router.poll(20):
                router.send_multipart(router.recv_multipart())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join(5)
        ctx.destroy(linger=0)


def test_a_reply_whose_edge_a_send_took_is_returned_at_once(tmp_path: Path) -> None:
    with echoing(tmp_path) as endpoint:
        transport = ZmqTransport(endpoint)
        try:
            transport.send(b"first")
            time.sleep(0.1)  # the echo is back in libzmq, announced by an edge
            transport.send(b"second")  # libzmq processes its commands: the edge is gone
            started = time.monotonic()
            assert transport.recv(timeout=3) == b"first"
            assert transport.recv(timeout=3) == b"second"
            assert time.monotonic() - started < 1.0
        finally:
            transport.close()


def test_a_wake_from_another_thread_ends_a_wait_and_a_timeout_is_kept(tmp_path: Path) -> None:
    with echoing(tmp_path) as endpoint:
        transport = ZmqTransport(endpoint)
        try:
            threading.Timer(0.1, transport.wake).start()
            started = time.monotonic()
            assert transport.recv(timeout=5) is None
            assert 0.05 < time.monotonic() - started < 2.0
            started = time.monotonic()
            assert transport.recv(timeout=0.2) is None
            assert 0.15 < time.monotonic() - started < 2.0
            transport.send(b"after")  # the transport still serves
            assert transport.recv(timeout=3) == b"after"
        finally:
            transport.close()
