"""Many clients at once: 16 client processes each read a 4 KB file through
``Client.call`` as fast as they can for a few seconds; calls per second in total,
against 16 processes pinging a raw ZeroMQ echo server (msgspec framing) in the same run.

The daemon's protocol loop only speaks the protocol; the reads run in tool workers,
which can use the other cores. Several rounds; median and range reported, with the
protocol process's CPU time per call (its journal thread included) over the middle of
each round, and the whole machine's (every process: clients, daemon, workers, kernel).
The latter bounds what any change of process shape can reach: at that CPU per call, the
machine's cores, all busy, carry at most ``cores / cpu per call`` calls a second (the
"ceiling" printed), however the daemon's work is spread over processes.

With ``--against DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base
COMMIT``) a daemon of that tree runs beside this tree's, rounds alternating between
them, and the ratio of their rates and of their protocol CPU per call is reported.
``--against`` may be given several times: every tree is measured in the same run, which
puts a bisect's points side by side (a regression spread over many commits shows where
its steps are). With ``--config FILE`` the second daemon is this tree's under that
configuration instead, which measures what a setting costs under load
(``[journal]\nenabled = false``: the journal's share).

    .venv/bin/python bench/bench_throughput.py [rounds] [--against DIR ... | --config FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import psutil
import zmq

from _common import running_daemon, tree_environment
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


class Round(NamedTuple):
    calls_per_second: float
    protocol_cpu: float  # µs per call, the protocol process (0 when not watched)
    machine_cpu: float  # µs per call, every process on the machine (0 when not watched)


def _machine_busy() -> float:
    """Seconds of CPU every core has spent not idle since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "guest", 0.0))


def rate(target: object, endpoint: str, protocol: psutil.Process | None = None) -> Round:
    """Calls per second of ``CLIENTS`` processes running ``target``, and the CPU µs per
    call of ``protocol`` and of the whole machine over the middle of the round."""
    counts: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start = time.time() + 1.0
    procs = [multiprocessing.Process(target=target, args=(endpoint, start, counts)) for _ in range(CLIENTS)]
    for proc in procs:
        proc.start()
    cpu = machine = 0.0
    if protocol is not None:
        time.sleep(max(0.0, start + 0.5 - time.time()))
        before, machine_before = sum(protocol.cpu_times()[:2]), _machine_busy()
        time.sleep(SECONDS - 1.0)
        cpu, machine = sum(protocol.cpu_times()[:2]) - before, _machine_busy() - machine_before
    total = sum(counts.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join()
    calls_per_second = total / SECONDS
    calls_measured = calls_per_second * (SECONDS - 1.0)
    return Round(calls_per_second, cpu / calls_measured * 1e6, machine / calls_measured * 1e6)


def protocol_process(endpoint: str) -> psutil.Process:
    """The daemon serving ``endpoint`` (its protocol process: the one whose command line names it)."""
    for process in psutil.process_iter(["cmdline"]):
        if endpoint in (process.info["cmdline"] or []):
            return process
    raise SystemExit(f"no daemon serves {endpoint}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    other = parser.add_mutually_exclusive_group()
    other.add_argument(
        "--against", type=Path, action="append", default=[], help="another checkout, measured in the same run"
    )
    other.add_argument("--config", type=Path, help="this tree under this configuration, measured in the same run")
    args = parser.parse_args()
    trees: dict[str, tuple[dict[str, str] | None, tuple[str, ...]]] = {"this tree": (None, ())}
    for checkout in args.against:
        trees[str(checkout)] = (tree_environment(checkout.resolve()), ())
    if args.config:
        trees[str(args.config)] = (None, ("--config", str(args.config.resolve())))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = four_kb_root(Path(tmp))
        echo_endpoint = f"ipc://{tmp}/echo.sock"
        server = start_echo_server(echo_endpoint)
        endpoints = {
            name: stack.enter_context(running_daemon(root, *extra, env=env)) for name, (env, extra) in trees.items()
        }
        protocols = {name: protocol_process(endpoint) for name, endpoint in endpoints.items()}
        echo_rates: list[float] = []
        reads: dict[str, list[Round]] = {name: [] for name in trees}
        for round_ in range(args.rounds):
            echo_rates.append(rate(_echo_client, echo_endpoint).calls_per_second)
            for name in list(trees) if round_ % 2 == 0 else list(trees)[::-1]:
                reads[name].append(rate(_read_client, endpoints[name], protocols[name]))
        server.terminate()
    print(f"# {CLIENTS} clients at once, {SECONDS:g} s per round, {args.rounds} rounds ({sys.platform})")
    print(f"raw zmq echo [baseline]        {statistics.median(echo_rates):9.0f} calls/s")
    cores = psutil.cpu_count() or 1
    for name, figures in reads.items():
        rates = [r.calls_per_second for r in figures]
        ratios = [r / e for r, e in zip(rates, echo_rates, strict=True)]
        label = "read_file 4 KB via Client.call" + ("" if name == "this tree" else f" ({name})")
        machine = statistics.median(r.machine_cpu for r in figures)
        print(
            f"{label} {statistics.median(rates):9.0f} calls/s   ratio {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f})   protocol CPU "
            f"{statistics.median(r.protocol_cpu for r in figures):.0f} µs/call   all processes "
            f"{machine:.0f} µs/call (ceiling on {cores} cores {cores * 1e6 / machine:.0f} calls/s)"
        )
    ours = reads["this tree"]
    for name, theirs in reads.items():
        if name == "this tree":
            continue
        ratios = [a.calls_per_second / b.calls_per_second for a, b in zip(ours, theirs, strict=True)]
        cpu = [a.protocol_cpu / b.protocol_cpu for a, b in zip(ours, theirs, strict=True)]
        print(
            f"this tree / {name}: {statistics.median(ratios):.2f}x the calls "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}x over {args.rounds} rounds), "
            f"{statistics.median(cpu):.3f}x the protocol CPU per call (range {min(cpu):.3f}-{max(cpu):.3f}x)"
        )


if __name__ == "__main__":
    main()
