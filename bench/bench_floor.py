"""The floor under a confined read: what toold's process shape costs when nothing else
runs, next to the peer a user would otherwise pick and to the raw echo.

toold's read crosses four processes' worth of wake-ups: the client, the protocol
process, the per-user worker (which reads the file under confinement as the client's
user) and back. This bench builds that shape with no work at all between the hops:

* **echo**: a ZeroMQ ROUTER in another process answering each frame (two wake-ups, plus
  libzmq's I/O thread on each side);
* **relay**: the same ROUTER handing each frame to a worker process over a
  ``SOCK_SEQPACKET`` socket pair; the worker reads the 4 KB file (``open``, ``read``,
  ``close``) and answers, and the relay sends that back: toold's read with its protocol
  loop, policy, journal, audit and confinement all taken out, both servers blocking in
  ``recv`` (no event loop);
* **peer**: the reference MCP filesystem server's ``read_text_file`` over stdio (one Node
  process, no separation), as ``bench_peer.py`` drives it;
* **toold**: ``Client.call("read_file")`` against a real daemon.

Per round: the CPU per call of each side's server processes (from a block of calls of
each), then p50 of each with all four called in turn, call by call, so that the
machine's drift lands on each alike; the relay's and toold's p50 against the peer's.
The relay's ratio to the peer is a lower bound for toold's: no change inside the daemon
takes a read below it without changing the process shape (fewer processes, or a
transport without libzmq's I/O thread).

With ``--config FILE`` toold's daemon runs under that configuration: what the floor is
with a guarantee taken out (``[journal]\nenabled = false`` and ``[daemon]\naudit =
"off"``: a read's journal record and its audit records).

    .venv/bin/python bench/bench_floor.py [calls-per-round] [rounds] [--config FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import socket
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import psutil
import zmq

from _common import running_daemon, sample_interleaved
from bench_cpu import cpu_seconds, serving_processes
from bench_peer import StdioPeer, npm_bin
from bench_roundtrip import echo_pair, four_kb_root
from toold_client import Client
from toold_protocol import Ping, decode_daemon_message, encode

FRAME = 1 << 20


def _worker(sock: socket.socket, root: str) -> None:
    """Answer each request with the bytes of the file it names, read from ``root``."""
    while True:
        request = sock.recv(FRAME)
        if not request:
            return
        fd = os.open(os.path.join(root, request.decode()), os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, FRAME)
        finally:
            os.close(fd)
        sock.send(data)


def _relay(endpoint: str, root: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        ours.close()
        _worker(theirs, root)
        os._exit(0)
    theirs.close()
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(endpoint)
    ready.set()
    decoder = msgspec.msgpack.Decoder(dict[str, str])
    while True:
        peer, frame = router.recv_multipart()
        request = decoder.decode(frame)
        ours.send(request["path"].encode())
        content = ours.recv(FRAME)
        router.send_multipart([peer, msgspec.msgpack.encode({"ok": True, "content": content.decode()})])


@contextlib.contextmanager
def relay_pair(tmp: str, root: Path) -> Iterator[tuple[list[psutil.Process], zmq.Socket[bytes]]]:
    """The relay and its worker in other processes, and a DEALER connected to the relay."""
    endpoint = f"ipc://{tmp}/relay.sock"
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_relay, args=(endpoint, str(root), ready), daemon=True)
    server.start()
    ready.wait()
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(endpoint)
    process = psutil.Process(server.pid)
    try:
        yield [process, *process.children()], dealer
    finally:
        dealer.close()
        server.kill()
        server.join()


def cpu_of(processes: list[psutil.Process]) -> float:
    """User plus system seconds of ``processes`` and their threads so far."""
    return sum(cpu_seconds(process) for process in processes)


def cpu_per_call(fn: Callable[[], object], processes: list[psutil.Process], n: int) -> float:
    """Seconds of CPU ``processes`` spend per call of ``fn``, over ``n`` calls in a row."""
    before = cpu_of(processes)
    for _ in range(n):
        fn()
    return (cpu_of(processes) - before) / n


def main(n: int = 1000, rounds: int = 5, config: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        target = str(root / "four_kb.txt")
        echo_server, echo = echo_pair(tmp)
        peer = StdioPeer([str(npm_bin("mcp-server-filesystem")), str(root)])
        counter = iter(range(10**9))
        request = msgspec.msgpack.encode({"path": "four_kb.txt"})
        reply = msgspec.msgpack.Decoder(dict[str, object])
        try:
            with (
                relay_pair(tmp, root) as (relay_processes, relay),
                running_daemon(root, *(("--config", config) if config else ())) as endpoint,
                Client(endpoint) as client,
            ):
                peer_process = psutil.Process(peer.pid)

                def daemon() -> list[psutil.Process]:
                    serving = serving_processes(endpoint)  # workers come and go
                    return serving["protocol"] + serving["workers"]

                def echo_call() -> None:
                    echo.send(encode(Ping(id=next(counter))))
                    decode_daemon_message(echo.recv())

                def relay_call() -> None:
                    relay.send(request)
                    assert len(reply.decode(relay.recv())["content"]) == 4096  # type: ignore[arg-type]

                def peer_call() -> None:
                    result = peer.request("tools/call", {"name": "read_text_file", "arguments": {"path": target}})
                    assert len(result["content"][0]["text"]) == 4096

                def toold_call() -> None:
                    result = client.call("read_file", {"path": "four_kb.txt"})
                    assert result.ok and len(result.content) == 4096

                fns = {"echo": echo_call, "relay": relay_call, "peer": peer_call, "toold": toold_call}
                servers: dict[str, Callable[[], list[psutil.Process]]] = {
                    "echo": lambda: [psutil.Process(echo_server.pid)],
                    "relay": lambda: relay_processes,
                    "peer": lambda: [peer_process],
                    "toold": daemon,
                }
                rows: dict[str, list[float]] = {"relay/peer": [], "toold/peer": [], "relay/echo": []}
                cpus: dict[str, list[float]] = {name: [] for name in fns}
                print(f"# the floor under a read: n={n} per round, {rounds} rounds, p50 µs and server CPU µs/call")
                for round_ in range(1, rounds + 1):
                    cpu = {name: cpu_per_call(fn, servers[name](), n) for name, fn in fns.items()}
                    times = sample_interleaved(fns, n, warmup=20)
                    p50 = {name: statistics.median(values) for name, values in times.items()}
                    rows["relay/peer"].append(p50["relay"] / p50["peer"])
                    rows["toold/peer"].append(p50["toold"] / p50["peer"])
                    rows["relay/echo"].append(p50["relay"] / p50["echo"])
                    for name, value in cpu.items():
                        cpus[name].append(value)
                    print(
                        f"round {round_}: "
                        + "  ".join(f"{name} {p50[name] * 1e6:5.0f} µs/{cpu[name] * 1e6:4.0f} cpu" for name in fns),
                        flush=True,
                    )
        finally:
            peer.close()
            echo_server.terminate()
        for label, values in rows.items():
            spread = f"range {min(values):.2f}-{max(values):.2f}x"
            print(f"{label:<11} p50 ratio median {statistics.median(values):.2f}x, {spread}")
        for name, values in cpus.items():
            print(f"{name:<11} server CPU per call median {statistics.median(values) * 1e6:5.0f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=1000)
    parser.add_argument("rounds", nargs="?", type=int, default=5)
    parser.add_argument("--config", help="toold's daemon under this configuration file")
    arguments = parser.parse_args()
    main(arguments.n, arguments.rounds, arguments.config)
