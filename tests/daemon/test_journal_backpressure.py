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
