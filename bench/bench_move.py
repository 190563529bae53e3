"""A directory moved with ``move_file`` and the move undone, through a real daemon, against
the same tree moved there and back with ``os.rename`` in the same run.

Two trees: one within the undo bound (its contents kept, so the move reads and hashes
them), one past it (kept as a move: nothing read). Each round moves and undoes each tree
once and renames it there and back once; the ratios are of the medians.

    .venv/bin/python bench/bench_move.py [rounds]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import running_daemon
from toold_client import CallSpec, Client

CONFIG = """
[tools.approval]
preset = "all"

[[tools.approval.rules]]
tool = "*"
decision = "allow"
conditions = [{ param = "path", operator = "matches", value = ".*" }]
"""
#: (name, files, bytes each): 40 MB within the 64 MiB undo bound, 100 MB past it.
TREES = (("40 x 1 MB (kept)", 40, 1_000_000), ("100 x 1 MB (moved whole)", 100, 1_000_000))


def make_tree(top: Path, files: int, size: int) -> None:
    (top / "sub").mkdir(parents=True)
    for i in range(files):
        (top / ("sub" if i % 2 else "") / f"f{i}.bin").write_bytes(os.urandom(size))


def move_and_undo(client: Client, root: Path) -> tuple[float, float, str]:
    """The move's time, the undo's, and why the undo was refused ("" when it was not:
    an older daemon refuses the undo of a tree past the bound; the tree is then moved
    back by hand, to go on)."""
    t0 = time.perf_counter()
    outcome = client.submit([CallSpec("move_file", {"source": "tree", "destination": "moved/tree"}, "m")])
    t1 = time.perf_counter()
    (undone,) = client.undo(outcome.batch_id).results
    t2 = time.perf_counter()
    if not outcome.results[0].ok:
        raise SystemExit(f"the move failed: {outcome.results[0].content[:300]}")
    if not undone.ok:
        os.rename(root / "moved/tree", root / "tree")
        os.rmdir(root / "moved")
        return t1 - t0, t2 - t1, undone.error.code if undone.error else "refused"
    return t1 - t0, t2 - t1, ""


def rename_there_and_back(root: Path) -> float:
    t0 = time.perf_counter()
    (root / "moved").mkdir()
    os.rename(root / "tree", root / "moved/tree")
    os.rename(root / "moved/tree", root / "tree")
    (root / "moved").rmdir()
    return time.perf_counter() - t0


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "toold.toml")
        config.write_text(CONFIG)
        root = Path(tmp, "root")
        root.mkdir()
        with running_daemon(root, "--config", str(config)) as endpoint, Client(endpoint, timeout=120) as client:
            for name, files, size in TREES:
                make_tree(root / "tree", files, size)
                moves, undos, renames, refused = [], [], [], ""
                for _ in range(rounds):
                    moved, undone, refused = move_and_undo(client, root)
                    moves.append(moved)
                    undos.append(undone)
                    renames.append(rename_there_and_back(root))
                bare = statistics.median(renames)
                move, undo = statistics.median(moves), statistics.median(undos)
                print(
                    f"{name:<26} move p50 {move * 1e3:8.1f} ms  undo p50 {undo * 1e3:8.1f} ms  "
                    f"rename there and back {bare * 1e3:6.2f} ms  ratio (move + undo) {(move + undo) / bare:8.1f}x"
                    + (f"  (undo refused: {refused})" if refused else ""),
                    flush=True,
                )
                shutil.rmtree(root / "tree")


if __name__ == "__main__":
    main()
