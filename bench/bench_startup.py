"""Time from exec of ``toold serve`` to its first pong, vs a bare interpreter start.

Target: ready (first pong) within 300 ms of exec on the reference machine.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import zmq

from _common import BIN
from toold_protocol import Ping, encode


def first_pong(n: int) -> list[float]:
    times = []
    for _ in range(n):
        with tempfile.TemporaryDirectory() as d:
            sock = f"{d}/s.sock"
            os.mkdir(f"{d}/state")
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [str(BIN / "toold"), "serve", "--root", d, "--endpoint", f"ipc://{sock}", "--state-dir", f"{d}/state"],
                stderr=subprocess.DEVNULL,
            )
            ctx = zmq.Context()
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            while not os.path.exists(sock):
                time.sleep(0.001)
            dealer.connect(f"ipc://{sock}")
            dealer.send(encode(Ping(id=1)))
            dealer.recv()
            times.append(time.perf_counter() - t0)
            proc.terminate()
            proc.wait()
            dealer.close()
            ctx.term()
    return times


def bare(n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return times


def main(n: int = 15) -> None:
    base, ready = bare(n), first_pong(n)
    print(f"# startup, n={n}")
    print(f"bare python -c pass          p50 {statistics.median(base) * 1000:6.0f} ms")
    print(
        f"toold serve -> first pong    p50 {statistics.median(ready) * 1000:6.0f} ms   max {max(ready) * 1000:.0f} ms"
        f"   ratio {statistics.median(ready) / statistics.median(base):.1f}x"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
