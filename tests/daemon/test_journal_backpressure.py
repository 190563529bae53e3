"""A journal that falls behind slows the clients whose batches wait for it; it never
makes them fail. A daemon served in this process with a journal writer held back by the
test (``tests.held_journal``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from tests.held_journal import daemon_with_a_journal_behind
from toold_client import Client
from toold_daemon.service import running

pytestmark = pytest.mark.trio


async def test_sequential_calls_wait_for_a_journal_behind_instead_of_being_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends one call after another, each answered: while the journal is
    behind, each ended batch keeps its slot until its record is written. The next call
    waits for that (before, past the per-uid limit of running batches, it was refused
    with TOO_MANY_BATCHES: a busy journal failed well-behaved clients)."""

    def five_calls(endpoint: str) -> tuple[list[bool], float]:
        started = time.monotonic()
        with Client(endpoint, timeout=30) as client:
            oks = [client.call("read_file", {"path": "a.txt"}).ok for _ in range(5)]
        return oks, time.monotonic() - started

    limits = {"max_running_batches_per_uid": 2, "max_batches_per_session": 2}
    async with (
        daemon_with_a_journal_behind(tmp_path, monkeypatch, **limits) as (endpoint, gate),
        trio.open_nursery() as nursery,
    ):

        async def open_the_journal_later() -> None:
            await trio.sleep(0.5)
            gate.set()

        nursery.start_soon(open_the_journal_later)
        oks, took = await trio.to_thread.run_sync(five_calls, endpoint)
    assert oks == [True] * 5
    assert took >= 0.4  # the second call waited for the first one's record


async def test_a_few_large_results_behind_the_journal_make_the_session_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog is bounded in bytes too, not only in writes (5,000 of them): reads of
    a 60 KB file, the journal held, eight one after another on one session. The first records
    are queued and the calls answered at once; once the queue holds more than
    ``JOURNAL_BACKLOG_BYTES`` of results, the ended batch keeps its slot until the disk
    answers, so the next call waits. (Counted in writes only, 5,000 reads of 800 KB were
    4 GB held in memory.)"""
    monkeypatch.setattr(running, "JOURNAL_BACKLOG_BYTES", 100_000)
    answered_at: list[float] = []

    def eight_reads(endpoint: str) -> list[bool]:
        with Client(endpoint, timeout=30) as client:
            oks = []
            for _ in range(8):
                oks.append(client.call("read_file", {"path": "big.txt"}).ok)
                answered_at.append(time.monotonic())
            return oks

    async with daemon_with_a_journal_behind(tmp_path, monkeypatch, every_read_waits=False) as (endpoint, gate):
        (tmp_path / "root" / "big.txt").write_text(("y" * 99 + "\n") * 600)
        opened_at = 0.0

        async def open_the_journal_later() -> None:
            nonlocal opened_at
            await trio.sleep(1.0)
            opened_at = time.monotonic()
            gate.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_the_journal_later)
            oks = await trio.to_thread.run_sync(eight_reads, endpoint)
    assert oks == [True] * 8
    # the first is answered at once; within a few more (when the held thread takes the
    # writes queued so far is a matter of timing) the queue passes 100 KB, and the last read
    # waits for the disk (counted in writes, all eight would have been answered at once)
    assert answered_at[0] < opened_at <= answered_at[-1]
