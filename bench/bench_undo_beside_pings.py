"""What one client's large undo costs every other client: pings (served by the daemon's
loop alone) while another client deletes a 60 MB file and undoes the delete, again and
again, against the same pings with nobody else there, in the same run.

Each delete keeps the file's 60 MB as a pre-image and each undo sends it back to a
worker: what of that the protocol process does on its loop, every client waits for.

    .venv/bin/python bench/bench_undo_beside_pings.py [seconds]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import running_daemon
from bench_move import CONFIG
from toold_client import CallSpec, Client

SIZE = 60_000_000


def pings(endpoint: str, seconds: float) -> list[float]:
    times = []
    with Client(endpoint, timeout=60) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - t0)
            time.sleep(0.002)
    return times


def churn(endpoint: str, stop: threading.Event, done: list[int]) -> None:
    with Client(endpoint, timeout=120) as client:
        while not stop.is_set():
            deleted = client.submit([CallSpec("delete_file", {"path": "big.bin"}, "d")])
            (undone,) = client.undo(deleted.batch_id).results
            if not (deleted.results[0].ok and undone.ok):
                raise SystemExit(f"delete or undo failed: {deleted.results[0].content} / {undone.content}")
            done[0] += 1


def line(name: str, times: list[float]) -> str:
    times = sorted(times)
    p99 = times[int(len(times) * 0.99)]
    return (
        f"{name:<30} n={len(times):5d}  p50 {statistics.median(times) * 1e3:6.2f} ms  p99 {p99 * 1e3:7.2f} ms  "
        f"max {times[-1] * 1e3:7.2f} ms"
    )


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "toold.toml")
        config.write_text(CONFIG)
        root = Path(tmp, "root")
        root.mkdir()
        (root / "big.bin").write_bytes(os.urandom(SIZE))
        with running_daemon(root, "--config", str(config)) as endpoint:
            alone = pings(endpoint, seconds)
            print(line("pings alone", alone), flush=True)
            stop, done = threading.Event(), [0]
            other = threading.Thread(target=churn, args=(endpoint, stop, done))
            other.start()
            try:
                beside = pings(endpoint, seconds)
            finally:
                stop.set()
                other.join()
            print(line(f"beside {done[0]} delete + undo", beside), flush=True)
            ratio = sorted(beside)[int(len(beside) * 0.99)] / sorted(alone)[int(len(alone) * 0.99)]
            print(f"p99 beside / p99 alone: {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
