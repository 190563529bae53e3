"""What the egress proxy's relay costs per byte, alone: a download from a local server
straight, against the same download through ``relay`` (the egress process's code, in
this process), read by a program that takes whatever the socket holds at once and by
curl (which reads in small pieces). Both read into nothing; rounds alternate.

    .venv/bin/python bench/bench_relay.py [MB] [rounds]
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import trio

from toold_daemon.egress.relay import Budget, relay


def serve(size: int) -> int:
    """A server on 127.0.0.1 answering each connection's first bytes with ``size`` bytes
    (behind an HTTP head, for curl), then closing; its port."""
    body = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size + b"x" * size
    listener = socket.create_server(("127.0.0.1", 0))

    def one(conn: socket.socket) -> None:
        with conn:
            conn.recv(4096)
            conn.sendall(body)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def bulk_read(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\n\r\n")
        buffer = bytearray(1 << 20)
        while conn.recv_into(buffer):
            pass


def curl(port: int) -> None:
    subprocess.run(["curl", "-sS", "--noproxy", "*", "-o", "/dev/null", f"http://127.0.0.1:{port}/"], check=True)


async def relaying(upstream_port: int, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    task_status.started(listener.socket.getsockname()[1])
    async with trio.open_nursery() as nursery:
        while True:
            client = await listener.accept()

            async def one(client: trio.SocketStream) -> None:
                async with client, await trio.open_tcp_stream("127.0.0.1", upstream_port) as upstream:
                    await relay(client, upstream, Budget(1 << 50), lambda outbound, moved: None)

            nursery.start_soon(one, client)


async def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    port = serve(megabytes << 20)
    readers: dict[str, Callable[[int], None]] = {"bulk reader": bulk_read, "curl": curl}
    async with trio.open_nursery() as nursery:
        relayed_port = await nursery.start(relaying, port)
        print(f"# {megabytes} MB from 127.0.0.1, {rounds} rounds, medians")
        for name, read in readers.items():
            times: dict[str, list[float]] = {"direct": [], "relayed": []}
            for _ in range(rounds):
                for way, target in (("direct", port), ("relayed", relayed_port)):
                    t0 = time.perf_counter()
                    await trio.to_thread.run_sync(read, target)
                    times[way].append(time.perf_counter() - t0)
            direct, relayed = (statistics.median(times[w]) / megabytes * 1e3 for w in ("direct", "relayed"))
            print(
                f"{name:12} direct {direct:.3f} ms/MB [baseline]   relayed {relayed:.3f} ms/MB"
                f"   ratio {relayed / direct:.2f}x   added {relayed - direct:+.3f} ms/MB"
            )
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
