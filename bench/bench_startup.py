"""Time from exec of ``toold serve`` to its first pong and to its first tool result
(a 4 KB ``read_file``), against a bare interpreter start.

With ``--against DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base
COMMIT``) the same figures for that tree come from the same run, rounds alternating, so
the machine's drift hits both alike. Both trees run with compiled bytecode (this machine
may set PYTHONDONTWRITEBYTECODE, which would otherwise compile every module at every
start).

    .venv/bin/python bench/bench_startup.py [rounds] [--against DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from toold_client import Client
from toold_protocol import Ping, encode

HERE = Path(__file__).resolve().parent.parent
SOURCES = ("protocol/src", "client/src", "daemon/src")


def start_once(tree: Path) -> tuple[float, float]:
    """Seconds from exec to the first pong, and to the first read_file result."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / s) for s in SOURCES))
    with tempfile.TemporaryDirectory() as d:
        Path(d, "f.txt").write_text("x" * 4095 + "\n")
        sock = f"{d}/s.sock"
        os.mkdir(f"{d}/state")
        command = [sys.executable, "-m", "toold_daemon", "serve", "--root", d, "--endpoint", f"ipc://{sock}"]
        t0 = time.perf_counter()
        proc = subprocess.Popen([*command, "--state-dir", f"{d}/state"], stderr=subprocess.DEVNULL, env=env)
        try:
            ctx = zmq.Context()
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            while not os.path.exists(sock):
                time.sleep(0.001)
            dealer.connect(f"ipc://{sock}")
            dealer.send(encode(Ping(id=1)))
            dealer.recv()
            pong = time.perf_counter() - t0
            dealer.close()
            ctx.term()
            with Client(f"ipc://{sock}", timeout=30) as client:
                result = client.call("read_file", {"path": "f.txt"})
            first = time.perf_counter() - t0
            if not result.ok:
                raise SystemExit(f"read_file failed: {result.content[:300]}")
        finally:
            proc.terminate()
            proc.wait()
    return pong, first


def bare(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return times


def _line(name: str, values: list[float], base: float) -> str:
    p50 = statistics.median(values)
    spread = f"[{min(values) * 1e3:.0f}–{max(values) * 1e3:.0f}]"
    return f"{name:<36} p50 {p50 * 1e3:6.0f} ms {spread:>12}   {p50 / base:5.1f}x bare"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int, nargs="?", default=12)
    parser.add_argument("--against", type=Path, help="another checkout, measured in the same run")
    args = parser.parse_args()
    trees = {"this tree": HERE} | ({f"{args.against}": args.against.resolve()} if args.against else {})
    for tree in trees.values():
        for source in SOURCES:
            compileall.compile_dir(tree / source, quiet=1)
    base = statistics.median(bare(args.rounds))
    figures: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            pong, first = start_once(tree)
            figures[name][0].append(pong)
            figures[name][1].append(first)
    print(f"# startup, {args.rounds} rounds; bare python -c pass p50 {base * 1e3:.0f} ms")
    for name, (pongs, firsts) in figures.items():
        print(_line(f"{name}: exec -> first pong", pongs, base))
        print(_line(f"{name}: exec -> first read_file", firsts, base))
    if args.against:
        ours, theirs = figures["this tree"], figures[f"{args.against}"]
        for what, i in (("first pong", 0), ("first read_file", 1)):
            ratio = statistics.median(ours[i]) / statistics.median(theirs[i])
            print(f"ratio this tree / {args.against}, {what}: {ratio:.2f}")


if __name__ == "__main__":
    main()
