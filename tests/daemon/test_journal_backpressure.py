"""A journal that falls behind slows the clients whose batches wait for it; it never
makes them fail. A daemon served in this process with a journal writer held back by the
test (``tests.held_journal``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import pytest
import trio

from tests.held_journal import daemon_with_a_journal_behind, hold_back_journal_writer
from toold_client import CallSpec, Client
from toold_daemon.records.journal import Journal
from toold_daemon.records.stored_batches import Submission
from toold_daemon.service import running
from toold_protocol import Identity, PlannedCall, ToolCall

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


async def test_a_uid_whose_writes_fill_the_queue_waits_and_another_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog is counted per uid: one user reading large files while the disk lags
    holds back that user's next batches, not another user's (whose reads waited up to
    240 ms behind the other's queue before, about 30 ms of CPU contention now)."""
    monkeypatch.setattr(running, "JOURNAL_BACKLOG_BYTES", 1000)
    gate = hold_back_journal_writer(monkeypatch)
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        for n in range(4):  # the thread takes the first at once and waits at the gate
            journal.record_ended(submission(f"a{n}", 1000, 600), [None], "finished")
            await trio.sleep(0.05)
        journal.record_ended(submission("b0", 1001, 600), [None], "finished")
        assert journal.backlog_of(1000)[0] >= 2 and journal.backlog_of(1000)[1] > 1000
        assert journal.backlog_of(1001) == (1, journal.backlog_of(1001)[1])
        assert running.journal_holds_back(journal, 1000)
        assert not running.journal_holds_back(journal, 1001)
        monkeypatch.setattr(running, "JOURNAL_BACKLOG_BYTES_ALL", 1000)  # everyone's together: all wait
        assert running.journal_holds_back(journal, 1001)
    finally:
        gate.set()
        journal.flush()
        assert journal.backlog_of(1000) == (0, 0) == journal.backlog_of(1001)
        journal.close()


def submission(batch_id: str, uid: int, argument_bytes: int) -> Submission:
    arguments = msgspec.Raw(msgspec.msgpack.encode({"x": "y" * argument_bytes}))
    call = ToolCall(call_id="c", name="write_file", arguments=arguments)
    planned = [PlannedCall(index=0, call_id="c", name="write_file", disposition="run", summary="s", risk="low")]
    return Submission(batch_id, Identity(uid=uid, gid=uid, pid=1), "t", None, "f", [call], planned)


async def test_a_listing_waits_for_the_journal_without_holding_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """list_batches must see every batch recorded before it, so it waits for the journal's
    queue; it did so holding the event loop (``flush``), and under one user's flood of large
    results every client waited with it, as often as that user asked for a listing. Now
    only the listing waits: another client's ping is answered while the disk is held."""

    def scenario(endpoint: str, gate: threading.Event) -> tuple[float, list[str], bool]:
        with Client(endpoint, timeout=30) as lister, Client(endpoint, timeout=30) as pinger:
            read = CallSpec("read_file", {"path": "a.txt"})
            batch_id = lister.submit([read]).batch_id  # its record waits at the gate
            listed: list[str] = []
            thread = threading.Thread(target=lambda: listed.extend(b.batch_id for b in lister.list_batches()))
            thread.start()
            time.sleep(0.2)  # the listing waits for the journal
            waited = not listed
            ping = pinger.ping(timeout=5)
            gate.set()
            thread.join(10)
            return ping, listed, waited and batch_id in listed

    async with daemon_with_a_journal_behind(tmp_path, monkeypatch, every_read_waits=False) as (endpoint, gate):
        ping, listed, waited_then_saw = await trio.to_thread.run_sync(scenario, endpoint, gate)
    assert waited_then_saw, listed
    assert ping < 0.5  # with the loop held it waited until the gate opened (20 s at most)
