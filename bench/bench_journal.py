"""Cost of journaling per call: synchronous=normal and =full against no journal, same run.

Each sample is one small read_file call through the client (a 3-transaction journal
trail: batch+calls, started mark, result, plus the final state). Printed as p50/p99 and
the ratio to the same call with the journal off.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _common import report, running_daemon, sample
from toold_client import Client


def measure(root: Path, config: str, n: int) -> list[float]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as cfg:
        cfg.write(config)
    with running_daemon(root, "--config", cfg.name) as endpoint, Client(endpoint) as client:
        return sample(lambda: client.call("read_file", {"path": "f.txt"}), n)


def main(n: int = 1500) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        (root / "f.txt").write_text("hello\n" * 100)
        off = measure(root, "[journal]\nenabled = false\n", n)
        normal = measure(root, '[journal]\nsynchronous = "normal"\n', n)
        full = measure(root, '[journal]\nsynchronous = "full"\n', n)
    print(f"# journaling cost per read_file call, n={n}")
    report("journal off [baseline]", off)
    report("journal synchronous=normal", normal, off)
    report("journal synchronous=full", full, off)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
