"""Round trip of a 4 KB read_file through the client vs a raw ZeroMQ echo, same framing.

The echo server is a ROUTER in another process that decodes each msgspec frame and
answers with an encoded reply, so both sides pay the same encode/decode and socket
costs; what remains is the daemon's own work. Several rounds, each measuring all three
in turn; the summary gives the median and range over rounds. Target: read p50 <= 3x echo
p50 and p99 <= 2 ms (the long-run goal is 2x).
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
from pathlib import Path

import zmq

from _common import pct, report, running_daemon, sample
from toold_client import Client
from toold_protocol import Ping, Pong, decode_client_message, decode_daemon_message, encode


def echo_server(endpoint: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while True:
        peer, frame = sock.recv_multipart()
        message = decode_client_message(frame)
        if not isinstance(message, Ping):
            break
        sock.send_multipart([peer, encode(Pong(id=message.id))])


def four_kb_root(tmp: Path) -> Path:
    """A sandbox root holding ``four_kb.txt`` (64 lines of 64 bytes)."""
    root = tmp / "root"
    root.mkdir()
    (root / "four_kb.txt").write_text(("x" * 63 + "\n") * 64)
    return root


def start_echo_server(endpoint: str) -> multiprocessing.Process:
    """The baseline's server, started and bound (terminate it when done)."""
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=echo_server, args=(endpoint, ready), daemon=True)
    server.start()
    ready.wait()
    return server


def echo_pair(tmp: str) -> tuple[multiprocessing.Process, zmq.Socket[bytes]]:
    """The baseline: an echo server in another process and a DEALER connected to it."""
    endpoint = f"ipc://{tmp}/echo.sock"
    server = start_echo_server(endpoint)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    return server, dealer


def main(n: int = 2000, rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        server, dealer = echo_pair(tmp)
        counter = iter(range(10**9))

        def echo() -> None:
            dealer.send(encode(Ping(id=next(counter))))
            decode_daemon_message(dealer.recv())

        summary: dict[str, list[tuple[float, float, float]]] = {"ping": [], "read": []}
        print(
            f"# read_file round trip, n={n} per case, {rounds} rounds ({sys.platform}, python {sys.version.split()[0]})"
        )
        with running_daemon(root) as daemon_endpoint, Client(daemon_endpoint) as client:

            def ping() -> None:
                client.ping()

            def read() -> None:
                result = client.call("read_file", {"path": "four_kb.txt"})
                assert result.ok and len(result.content) == 4096

            for round_ in range(1, rounds + 1):
                echo_times = sample(echo, n)
                ping_times = sample(ping, n)
                read_times = sample(read, n)
                print(f"round {round_}")
                report("raw zmq echo (msgspec framing) [baseline]", echo_times)
                report("daemon ping", ping_times, echo_times)
                report("read_file 4 KB via Client.call", read_times, echo_times)
                base = statistics.median(echo_times)
                for name, times in (("ping", ping_times), ("read", read_times)):
                    p50 = statistics.median(times)
                    summary[name].append((p50 / base, p50, pct(times, 99)))
        server.terminate()
        for name, rows in summary.items():
            ratios, p50s, p99s = zip(*rows, strict=True)
            print(
                f"{name}: p50/echo median {statistics.median(ratios):.2f}x "
                f"(range {min(ratios):.2f}-{max(ratios):.2f}x); "
                f"p50 median {statistics.median(p50s) * 1e6:.0f} µs; p99 median {statistics.median(p99s) * 1e6:.0f} µs "
                f"(range {min(p99s) * 1e6:.0f}-{max(p99s) * 1e6:.0f} µs)"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
