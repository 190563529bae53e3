"""Many clients at once: 16 client processes each read a 4 KB file through
``Client.call`` as fast as they can for a few seconds; calls per second in total,
against 16 processes pinging a raw ZeroMQ echo server (msgspec framing) in the same run.

The daemon's protocol loop only speaks the protocol; the reads run in tool workers,
which can use the other cores. Several rounds; median and range reported.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq

from _common import running_daemon
from bench_roundtrip import four_kb_root, start_echo_server
from toold_client import Client
from toold_protocol import Ping, decode_daemon_message, encode

CLIENTS = 16
SECONDS = 3.0


def _echo_client(endpoint: str, start: float, counts: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    done = 0
    while time.time() < start:
        time.sleep(0.001)
    while time.time() < start + SECONDS:
        dealer.send(encode(Ping(id=done)))
        decode_daemon_message(dealer.recv())
        done += 1
    counts.put(done)


def _read_client(endpoint: str, start: float, counts: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    done = 0
    with Client(endpoint) as client:
        client.call("read_file", {"path": "four_kb.txt"})
        while time.time() < start:
            time.sleep(0.001)
        while time.time() < start + SECONDS:
            result = client.call("read_file", {"path": "four_kb.txt"})
            assert result.ok
            done += 1
    counts.put(done)


def rate(target: object, endpoint: str) -> float:
    counts: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start = time.time() + 1.0
    procs = [multiprocessing.Process(target=target, args=(endpoint, start, counts)) for _ in range(CLIENTS)]
    for proc in procs:
        proc.start()
    total = sum(counts.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join()
    return total / SECONDS


def main(rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        echo_endpoint = f"ipc://{tmp}/echo.sock"
        server = start_echo_server(echo_endpoint)
        echo_rates, read_rates = [], []
        with running_daemon(root) as endpoint:
            for _ in range(rounds):
                echo_rates.append(rate(_echo_client, echo_endpoint))
                read_rates.append(rate(_read_client, endpoint))
        server.terminate()
    ratios = [r / e for r, e in zip(read_rates, echo_rates, strict=True)]
    print(f"# {CLIENTS} clients at once, {SECONDS:g} s per round, {rounds} rounds ({sys.platform})")
    print(f"raw zmq echo [baseline]        {statistics.median(echo_rates):9.0f} calls/s")
    print(
        f"read_file 4 KB via Client.call {statistics.median(read_rates):9.0f} calls/s   "
        f"ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
