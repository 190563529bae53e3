"""A workspace's first command: the walk that finds denied and protected entries below the
roots (its zygote then covers them), over a 100,000-entry tree, against a bare
``os.scandir`` walk of the same tree (the floor: every entry visited, nothing matched).
Target: <= 250 ms for 100,000 entries.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from toold_daemon.config import Config
from toold_daemon.sandbox import build_sandbox
from toold_daemon.sandbox.denied_tree import find_denied


def make_tree(root: Path, directories: int = 1000, files: int = 99) -> int:
    """``directories`` directories of ``files`` files each (a few of them denied)."""
    for d in range(directories):
        directory = root / f"pkg{d // 100}" / f"mod{d}"
        directory.mkdir(parents=True)
        for f in range(files):
            (directory / f"file{f}.py").write_bytes(b"")
        if d % 250 == 0:
            (directory / ".env").write_bytes(b"SECRET=1\n")
    return sum(len(names) + len(dirs) for _root, dirs, names in os.walk(root))


def bare_walk(root: Path) -> int:
    count, pending = 0, [str(root)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                count += 1
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return count


def main(rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "workspace")
        entries = make_tree(root)
        sandbox = build_sandbox(Config(), [root])
        print(f"# denied-file walk over {entries} entries, {rounds} rounds (python {sys.version.split()[0]})")
        bare, walk = [], []
        bare_cpu, walk_cpu = [], []  # this thread's CPU time: what other processes do not move
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), time.thread_time()
            bare_walk(root)
            bare.append(time.perf_counter() - t0)
            bare_cpu.append(time.thread_time() - c0)
            t0, c0 = time.perf_counter(), time.thread_time()
            found = find_denied(sandbox, max_entries=1_000_000, protected=True)
            walk.append(time.perf_counter() - t0)
            walk_cpu.append(time.thread_time() - c0)
        assert found.complete and len(found.files) == 4, found.files
        base, ours = statistics.median(bare), statistics.median(walk)
        print(f"bare scandir walk [baseline]   {base * 1e3:7.1f} ms")
        print(
            f"find_denied (denied+protected) {ours * 1e3:7.1f} ms  ratio {ours / base:.2f}x  "
            f"{ours / entries * 1e6:.2f} µs/entry  (range {min(walk) * 1e3:.0f}-{max(walk) * 1e3:.0f} ms)"
        )
        print(
            f"least CPU time: bare walk {min(bare_cpu) * 1e3:.1f} ms, find_denied {min(walk_cpu) * 1e3:.1f} ms, "
            f"ratio {min(walk_cpu) / min(bare_cpu):.2f}x"
        )


if __name__ == "__main__":
    main()
