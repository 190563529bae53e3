"""Class Q, the daemon's memory: a client that reads large files in a loop cannot make the
daemon hold its results. Finished batches are kept for ``get_batch`` up to a count
(1,000) and, since a batch of 8 reads of 100 KB holds 800 KB, up to a byte budget
(``finished_batches_kept_bytes``); the oldest past it are dropped from memory and read
back from the journal when asked for. Before the budget, 1,000 such batches took the
protocol process from 43 to 913 MB in ten seconds."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.conftest import start_daemon
from toold_client import APPROVE_ALL

MB = 1024 * 1024
BIG = {"name": "read_file", "arguments": {"path": "big.txt"}}


def test_a_client_reading_large_files_in_a_loop_leaves_the_daemon_its_memory(tmp_path: Path, root: Path) -> None:
    (root / "big.txt").write_text(("y" * 99 + "\n") * 1000)  # 100 KB
    daemon = start_daemon(tmp_path, root, config=f"[daemon]\nfinished_batches_kept_bytes = {8 * MB}\n")
    try:
        protocol = psutil.Process(daemon.proc.pid)
        with daemon.client(timeout=60) as client:
            first = client.submit([BIG] * 8, events="results")
            assert all(result.ok for result in first.results)
            before = protocol.memory_info().rss
            for _ in range(150):  # 120 MB of results
                client.submit([BIG] * 8, events="results")
            grown = protocol.memory_info().rss - before
            # the first batch was dropped from memory long ago, and is still answered
            status = client.get_batch(first.batch_id)
        assert status.state == "finished"
        assert [len(result.content) for result in status.results] == [len(r.content) for r in first.results]
        assert grown < 60 * MB, f"the daemon grew by {grown // MB} MB holding finished results"
    finally:
        daemon.stop()


def test_large_arguments_count_against_the_kept_batches_budget_too(tmp_path: Path, root: Path) -> None:
    """A finished batch also holds its calls' arguments (``get_batch`` answers them), so a
    client writing files in a loop (eight of 200 KB a batch, under the 256 KB a call may
    carry) made the daemon keep them by count only: 60 such batches are 96 MB. They count
    against the byte budget now, and the journal's queue counts them too."""
    daemon = start_daemon(tmp_path, root, config=f"[daemon]\nfinished_batches_kept_bytes = {8 * MB}\n")
    content = "w" * 200_000
    try:
        protocol = psutil.Process(daemon.proc.pid)
        with daemon.client(timeout=60) as client:
            first = client.submit(writes(content, 0), on_confirm=lambda request: APPROVE_ALL)
            assert all(result.ok for result in first.results), first.results[0]
            before = protocol.memory_info().rss
            for n in range(1, 61):
                client.submit(writes(content, n), on_confirm=lambda request: APPROVE_ALL)
            grown = protocol.memory_info().rss - before
            status = client.get_batch(first.batch_id)  # from the journal now
        assert status.state == "finished" and all(result.ok for result in status.results)
        assert grown < 50 * MB, f"the daemon grew by {grown // MB} MB holding finished batches' arguments"
    finally:
        daemon.stop()


def writes(content: str, batch: int) -> list[dict[str, object]]:
    return [{"name": "write_file", "arguments": {"path": f"out{batch}-{n}.txt", "content": content}} for n in range(8)]
