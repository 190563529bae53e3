"""Round trip of a 4 KB read_file through the client vs a raw ZeroMQ echo, same framing.

The echo server is a ROUTER in another process that decodes each msgspec frame and
answers with an encoded reply, so both sides pay the same encode/decode and socket
costs; what remains is the daemon's own work. Target: read p50 <= 2x echo p50.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
from pathlib import Path

import zmq

from _common import report, running_daemon, sample
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


def main(n: int = 3000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        endpoint = f"ipc://{tmp}/echo.sock"
        server = start_echo_server(endpoint)
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        counter = iter(range(10**9))

        def echo() -> None:
            dealer.send(encode(Ping(id=next(counter))))
            decode_daemon_message(dealer.recv())

        echo_times = sample(echo, n)
        with running_daemon(root) as daemon_endpoint, Client(daemon_endpoint) as client:

            def ping() -> None:
                client.ping()

            def read() -> None:
                result = client.call("read_file", {"path": "four_kb.txt"})
                assert result.ok and len(result.content) == 4096

            ping_times = sample(ping, n)
            read_times = sample(read, n)
        server.terminate()
        print(f"# read_file round trip, n={n} ({sys.platform}, python {sys.version.split()[0]})")
        report("raw zmq echo (msgspec framing) [baseline]", echo_times)
        report("daemon ping", ping_times, echo_times)
        report("read_file 4 KB via Client.call", read_times, echo_times)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
