"""What one client's commands cost everyone else, and the other way round: ``read_file``
latency from one client alone, then while another client runs ``shell true`` back to
back (same daemon, same run), and the commands' own latency alone and beside the reads.
Starting a command moves a process between cgroups, which in the kernel may wait out an
RCU grace period (milliseconds); done on the event loop, that wait was every other
client's too. The ratio of reads beside commands to reads alone shows it; the ratio of
commands beside reads to commands alone shows what a stream of reads costs the commands
(who goes first when the loop wakes with both ready).

With ``--against DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base
COMMIT``) the same figures for that tree come from the same run, rounds alternating.

    .venv/bin/python bench/bench_commands_beside_reads.py [rounds] [--against DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import pct, running_daemon, tree_environment
from bench_roundtrip import four_kb_root
from toold_client import Client

READS = 400
COMMANDS_FIRST = 100
ALLOW_SHELL = '[tools.approval]\nallowlist = ["shell"]\n'


def one_round(endpoint: str, figures: dict[str, list[float]]) -> None:
    with Client(endpoint) as commands, Client(endpoint) as reads:
        for _ in range(COMMANDS_FIRST):
            began = time.perf_counter()
            commands.call("shell", {"command": "true"})
            figures["shell"].append(time.perf_counter() - began)
        figures["alone"] += _timed_reads(reads)
        stop = threading.Event()

        def run_commands() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                result = commands.call("shell", {"command": "true"})
                figures["shell beside"].append(time.perf_counter() - began)
                assert result.ok, result.content

        beside = threading.Thread(target=run_commands)
        beside.start()
        try:
            figures["beside"] += _timed_reads(reads)
        finally:
            stop.set()
            beside.join()


def _timed_reads(client: Client) -> list[float]:
    times = []
    for _ in range(READS):
        began = time.perf_counter()
        result = client.call("read_file", {"path": "four_kb.txt"})
        times.append(time.perf_counter() - began)
        assert result.ok, result.content
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", nargs="?", type=int, default=6)
    parser.add_argument("--against", type=Path)
    options = parser.parse_args()
    trees: dict[str, Path | None] = {"this tree": None}
    if options.against:
        trees[str(options.against)] = options.against
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = four_kb_root(Path(tmp))
        config = Path(tmp, "shell.toml")
        config.write_text(ALLOW_SHELL)
        endpoints = {
            name: stack.enter_context(
                running_daemon(root, "--config", str(config), env=tree_environment(tree) if tree else None)
            )
            for name, tree in trees.items()
        }
        figures = {name: {"shell": [], "shell beside": [], "alone": [], "beside": []} for name in trees}
        for round_ in range(options.rounds):
            order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
            for name in order:
                one_round(endpoints[name], figures[name])
    print(f"# reads beside back-to-back shell commands, {options.rounds} rounds of {READS} reads")
    for name, by_case in figures.items():
        cases = (
            ("shell", "shell true alone"),
            ("shell beside", "shell beside reads"),
            ("alone", "read_file alone"),
            ("beside", "read_file beside"),
        )
        for case, label in cases:
            times = by_case[case]
            p50, p99 = statistics.median(times) * 1e3, pct(times, 99) * 1e3
            print(f"{name:>12}: {label:<19} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms")
        alone, beside = by_case["alone"], by_case["beside"]
        ratio = statistics.median(beside) / statistics.median(alone)
        tail = pct(beside, 99) / pct(alone, 99)
        print(f"{name:>12}: reads beside commands / alone: p50 {ratio:.2f}x  p99 {tail:.2f}x")
        shells = statistics.median(by_case["shell beside"]) / statistics.median(by_case["shell"])
        print(f"{name:>12}: commands beside reads / alone: p50 {shells:.2f}x")


if __name__ == "__main__":
    main()
