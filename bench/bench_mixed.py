"""One agent writing while others read: ``write_file`` latency from one client while 15
client processes read a 4 KB file as fast as they can, against the same load on a daemon
with the journal off (same run, rounds alternating). What the journal's bookkeeping
costs a side-effecting call when the daemon is busy.

    .venv/bin/python bench/bench_mixed.py [rounds]
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_throughput as throughput
from _common import running_daemon
from bench_roundtrip import four_kb_root
from toold_client import Client

READERS = 15
SECONDS = 5.0
ALLOW_WRITES = '[tools.approval]\nallowlist = ["write_file"]\n'


def _writer(endpoint: str, start: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    times: list[float] = []
    with Client(endpoint) as client:
        client.call("write_file", {"path": "w.txt", "content": "warm", "overwrite": True})
        while time.time() < start:
            time.sleep(0.001)
        n = 0
        while time.time() < start + SECONDS:
            began = time.perf_counter()
            result = client.call("write_file", {"path": f"w{n % 20}.txt", "content": "hello " * 100, "overwrite": True})
            times.append(time.perf_counter() - began)
            assert result.ok, result.content
            n += 1
    out.put(times)


def write_latencies(endpoint: str) -> list[float]:
    throughput.SECONDS = SECONDS
    counts: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    writes: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start = time.time() + 1.0
    readers = [
        multiprocessing.Process(target=throughput._read_client, args=(endpoint, start, counts)) for _ in range(READERS)
    ]
    writer = multiprocessing.Process(target=_writer, args=(endpoint, start, writes))
    for proc in [*readers, writer]:
        proc.start()
    times: list[float] = writes.get(timeout=120)
    for _ in readers:
        counts.get(timeout=120)
    for proc in [*readers, writer]:
        proc.join()
    return times


def main(rounds: int = 2) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        on, off = Path(tmp, "on.toml"), Path(tmp, "off.toml")
        on.write_text(ALLOW_WRITES)
        off.write_text(ALLOW_WRITES + "[journal]\nenabled = false\n")
        results: dict[str, list[float]] = {"journal off [baseline]": [], "journal on": []}
        with running_daemon(root, "--config", str(on)) as journaled, running_daemon(root, "--config", str(off)) as bare:
            endpoints = {"journal on": journaled, "journal off [baseline]": bare}
            for r in range(rounds):
                for name in sorted(endpoints, reverse=bool(r % 2)):
                    results[name] += write_latencies(endpoints[name])
    print(f"# write_file from one client while {READERS} clients read, {rounds} rounds of {SECONDS:.0f} s")
    base = statistics.median(results["journal off [baseline]"])
    for name, times in results.items():
        times.sort()
        p50, p99 = statistics.median(times), times[int(len(times) * 0.99)]
        shown = f"p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  ratio p50 {p50 / base:.2f}x"
        print(f"{name:24s} writes {len(times):5d}  {shown}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
