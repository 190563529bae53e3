"""Helpers shared by the benchmarks: start a real daemon, time things, print a table."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


#: Where each package's sources live in a checkout (for ``tree_environment``).
SOURCES = ("protocol/src", "client/src", "daemon/src")
#: ``toold`` as ``python -m``: the same entry in every checkout (its program's module moved).
TOOLD = (str(BIN / "python"), "-m", "toold_daemon")


def tree_environment(tree: Path) -> dict[str, str]:
    """The environment that runs ``toold`` from another checkout's sources (compiled
    first: this machine may set PYTHONDONTWRITEBYTECODE, which would compile every module
    at every start)."""
    import compileall
    import os

    for source in SOURCES:
        compileall.compile_dir(tree / source, quiet=1)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / s) for s in SOURCES))


@contextmanager
def running_daemon(root: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A daemon serving ``root`` on a private endpoint until the block ends; ``env``: that
    of another checkout (``tree_environment``)."""
    from toold_client import Client, DaemonUnavailable

    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/toold.sock"
        Path(tmp, "state").mkdir()
        # The daemon's log (and its audit lines, where no system journal takes them) goes to
        # a file, not between the benchmark's own lines.
        log = open(Path(tmp, "daemon.log"), "wb")  # noqa: SIM115 - closed with the process below
        proc = subprocess.Popen(
            [
                *TOOLD,
                "serve",
                "--root",
                str(root),
                "--endpoint",
                endpoint,
                "--state-dir",
                f"{tmp}/state",
                "--log-level",
                "WARNING",
                *extra,
            ],
            stderr=log,
            env=env,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with Client(endpoint, timeout=0.5) as c:
                        c.ping(timeout=0.5)
                    break
                except DaemonUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            yield endpoint
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()


def sample(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def sample_interleaved(fns: dict[str, Callable[[], object]], n: int, warmup: int = 3) -> dict[str, list[float]]:
    """Each of ``fns`` once a round, in turn, for ``n`` rounds: the machine's drift over
    the run then hits every one alike (timed one after another in blocks, a slow minute
    can land on one of them alone and decide the ratio)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def pct(times: list[float], q: float) -> float:
    return statistics.quantiles(times, n=100)[int(q) - 1] if len(times) > 1 else times[0]


def report(name: str, times: list[float], baseline: list[float] | None = None) -> None:
    p50, p99 = statistics.median(times), pct(times, 99)
    line = f"{name:<44} p50 {p50 * 1e6:9.1f} µs   p99 {p99 * 1e6:9.1f} µs"
    if baseline is not None:
        line += f"   ratio p50 {p50 / statistics.median(baseline):5.2f}x  p99 {p99 / pct(baseline, 99):5.2f}x"
    print(line, flush=True)
