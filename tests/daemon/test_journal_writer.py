"""The journal's writer thread on a real SQLite file: group commit, failures that stay
alone, durability before ``durable()`` returns, reads that see queued writes, and
checkpoints made by the thread."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from tests.held_journal import hold_back_journal_writer
from toold_daemon.records import journal_writer
from toold_daemon.records.journal import Journal, Submission
from toold_daemon.records.journal_writer import Commit, JournalWriteFailed, Rows
from toold_daemon.service.batch_ids import new_batch_id
from toold_protocol import Identity, PlannedCall, ToolCall, ToolResult

ME = Identity(uid=1000, gid=1000, pid=1)
CALL = ToolCall(call_id="c", name="read_file", arguments=msgspec.Raw(msgspec.msgpack.encode({"path": "a.txt"})))
PLAN = PlannedCall(index=0, call_id="c", name="read_file", disposition="run", summary="read a.txt", risk="low")


def submission(batch_id: str) -> Submission:
    return Submission(batch_id, ME, "test", None, "d", [CALL], [PLAN])


def ended(journal: Journal, batch_id: str, content: str = "A", *, awaited: bool = False) -> Commit:
    result = ToolResult(call_id="c", ok=True, content=content, display=content)
    return journal.record_ended(submission(batch_id), [result], "finished", awaited=awaited)


def committed(path: Path, batch_id: str) -> bool:
    """Seen by a connection of its own: committed, not merely queued."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone() is not None
    finally:
        db.close()


async def test_read_only_batches_are_merged_and_seen_by_reads(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        for n in range(50):
            ended(journal, f"b{n}", content=f"line {n}")
        stored = journal.load("b49")  # a read waits for what was queued before it
        assert stored is not None and stored.state == "finished"
        assert stored.results[0] is not None and stored.results[0].content == "line 49"
        assert stored.results[0].display == "line 49"  # stored once, given back twice
        assert all(committed(journal.path, f"b{n}") for n in range(50))
    finally:
        journal.close()


async def test_a_failing_write_fails_alone_in_a_merged_group(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        ended(journal, "first")
        journal.flush()
        ended(journal, "before")
        ended(journal, "first")  # the same id again: its insert fails
        ended(journal, "after")
        journal.flush()
        assert committed(journal.path, "before") and committed(journal.path, "after")
        stored = journal.load("first")
        assert stored is not None and len(stored.calls) == 1  # nothing of the failed write
    finally:
        journal.close()


async def test_an_awaited_write_is_committed_when_durable_returns(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        ended(journal, "queued")  # something queued: the awaited write waits its turn
        commit = journal.record_batch(submission("side"), started=0, awaited=True)
        await commit.durable()
        assert committed(journal.path, "side") and committed(journal.path, "queued")  # order kept
        idle = journal.started("side", 0)  # nothing queued: committed at once, here
        assert idle.settled
        await idle.durable()
    finally:
        journal.close()


async def test_a_failed_awaited_write_raises(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        for _ in range(2):
            commit = journal.record_batch(submission("twice"), awaited=True)
        with pytest.raises(JournalWriteFailed):
            await commit.durable()
    finally:
        journal.close()


async def test_checkpoints_are_made_by_the_writer_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_writer, "CHECKPOINT_EVERY", 20)
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        assert journal._writer_db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        before = journal.path.stat().st_size
        for n in range(30):
            journal.started("nothing", n)  # awaited writes, each a commit of its own
            await trio.sleep(0)
        deadline = time.monotonic() + 5
        while journal.path.stat().st_size == before and time.monotonic() < deadline:
            ended(journal, f"x{time.monotonic_ns()}")
            journal.flush()
            await trio.sleep(0.01)
        assert journal.path.stat().st_size > before  # pages copied from the WAL by a checkpoint
    finally:
        journal.close()


class SlowCheckpoints(sqlite3.Connection):
    """The checkpoints' connection, whose first checkpoint takes half a second (a slow
    disk, a large log); what each checkpoint answered is kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_started = threading.Event()
        self.answers: list[tuple[int, int, int]] = []

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if "wal_checkpoint" not in sql:
            return super().execute(sql, parameters)
        if not self.first_started.is_set():
            self.first_started.set()
            time.sleep(0.5)
        cursor = super().execute(sql, parameters)
        self.answers.append(tuple(cursor.fetchone()))  # type: ignore[arg-type]
        return cursor


async def test_a_checkpoint_does_not_hold_up_the_commits_that_come_during_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint copies the log into the database on a connection of its own: a
    side-effecting call's record committed meanwhile is durable at once, not after the
    checkpoint (which held one call in a hundred up for its 3-5 ms). What commits add
    meanwhile is copied too before the checkpoint ends (the log must not grow without
    bound under a steady stream of writes)."""
    monkeypatch.setattr(journal_writer, "CHECKPOINT_EVERY", 5)
    journal = Journal.open_in(tmp_path)
    slow = sqlite3.connect(journal.path, factory=SlowCheckpoints, isolation_level=None, check_same_thread=False)
    journal._checkpoint_db.close()
    journal._checkpoint_db = slow
    journal.start_writer()
    try:
        for n in range(5):
            await journal.started("nothing", n).durable()
        deadline = time.monotonic() + 5
        while not slow.first_started.is_set():
            assert time.monotonic() < deadline, "no checkpoint after five commits"
            await trio.sleep(0.001)
        started = time.monotonic()
        await journal.started("during", 0).durable()
        assert time.monotonic() - started < 0.25  # not after the checkpoint's 0.5 s
        assert not slow.answers  # the checkpoint still runs
        deadline = time.monotonic() + 5
        while len(slow.answers) < 2:
            assert time.monotonic() < deadline
            await trio.sleep(0.01)
        _busy, log_frames, copied = slow.answers[-1]
        assert log_frames == copied  # what came meanwhile was copied too
    finally:
        journal.close()


async def test_a_flood_of_large_writes_is_checkpointed_by_bytes_and_the_log_cut_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer than ``CHECKPOINT_EVERY`` commits of large writes: a checkpoint still comes
    once they carried ``CHECKPOINT_BYTES``, and the write-ahead log shrinks back to its
    limit after it (it is the journal's disk too)."""
    monkeypatch.setattr(journal_writer, "CHECKPOINT_BYTES", 2 * 1024 * 1024)
    monkeypatch.setattr(journal_writer, "CHECKPOINT_EVERY", 10_000)  # the count never comes into it
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    wal = Path(f"{journal.path}-wal")
    try:
        for n in range(40):  # 40 commits of 200 KB: 8 MB through the log
            ended(journal, f"big{n}", content="b" * 200_000, awaited=True)
            journal.flush()
            await trio.sleep(0)
        deadline = time.monotonic() + 5
        while wal.stat().st_size > 3 * 1024 * 1024 and time.monotonic() < deadline:  # the thread's turn
            ended(journal, f"small{time.monotonic_ns()}", awaited=True)  # a write after a checkpoint cuts the log
            await trio.sleep(0.01)
        assert wal.stat().st_size <= 3 * 1024 * 1024, wal.stat().st_size  # 8 MB without the bound
    finally:
        journal.close()


async def test_a_stalled_writer_shows_its_backlog_and_awaited_writes_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that stops answering: the queue is visible, in writes and in bytes (the
    service then makes read-only batches wait for their own write), and an awaited write
    waits."""
    gate = hold_back_journal_writer(monkeypatch, seconds=10)
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        ended(journal, "first")
        deadline = time.monotonic() + 5
        while journal.backlog() and time.monotonic() < deadline:  # the thread has taken it, and waits
            await trio.sleep(0.005)
        for n in range(20):
            ended(journal, f"q{n}", content="x" * 1000)
        # what the queue holds, in writes and in bytes of arguments and results (content and
        # display are the same: stored, and counted, once)
        assert (journal.backlog(), journal.backlog_bytes()) == (20, 20 * (len(CALL.arguments) + 1000))
        waited = ended(journal, "waited", awaited=True)
        with trio.move_on_after(0.2) as still_waiting:
            await waited.durable()
        assert still_waiting.cancelled_caught
        gate.set()
        await waited.durable()
        assert committed(journal.path, "waited") and (journal.backlog(), journal.backlog_bytes()) == (0, 0)
    finally:
        gate.set()
        journal.close()


def test_daemon_made_batch_ids_sort_in_the_order_they_are_made() -> None:
    ids = [new_batch_id() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == 5000
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in ids)
    # The random tails (drawn from a pool refilled every 680 ids) never repeat either.
    assert len({i[12:] for i in ids}) == 5000


def test_rows_of_one_shape_merge_and_others_do_not() -> None:
    a = Rows([("INSERT INTO t VALUES (?)", [(1,)])])
    b = Rows([("INSERT INTO t VALUES (?)", [(2,)])])
    c = Rows([("INSERT INTO u VALUES (?)", [(3,)])])
    assert a.shape() == b.shape() != c.shape()


async def test_an_awaited_write_takes_the_queue_with_it_instead_of_waiting_for_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load the thread lingers over queued reads; a side-effecting call's write is
    committed at once on the caller's thread with them, in order (handing it to the thread
    and back waited for the GIL twice: tens of milliseconds per call on a busy daemon)."""
    monkeypatch.setattr(journal_writer, "LINGER_SECONDS", 30.0)
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        for n in range(5):
            ended(journal, f"read{n}")
        await trio.sleep(0.05)
        assert journal.backlog() == 5  # the thread lingers over them, gathering more
        waited = ended(journal, "waited", awaited=True)
        assert waited.settled and journal.backlog() == 0  # committed before submit returned
        assert all(committed(journal.path, f"read{n}") for n in range(5)) and committed(journal.path, "waited")
    finally:
        journal.close()


def where_committed(journal: Journal, ident: list[int]) -> Commit:
    """A write nobody waits for that notes the thread it was committed on."""

    def write(db: sqlite3.Connection) -> None:
        ident.append(threading.get_ident())

    return journal._write(write)


def broken(db: sqlite3.Connection) -> None:
    raise OverflowError("Python int too large to convert to SQLite INTEGER")


@contextlib.asynccontextmanager
async def writing(tmp_path: Path, *, crowded: bool | None) -> AsyncIterator[Journal]:
    """A journal with its writer thread; unless ``crowded`` is None, the loop's task that
    commits the groups started while ``crowded`` (stopped, then the journal closed, at the end)."""
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        async with trio.open_nursery() as nursery:
            if crowded is not None:
                journal.bind_nursery(nursery, lambda: crowded)
                await trio.testing.wait_all_tasks_blocked()
            yield journal
            nursery.cancel_scope.cancel()
    finally:
        journal.close()


async def until_taken(journal: Journal) -> None:
    """Until nothing is queued any more (taken by the loop or the thread)."""
    with trio.fail_after(5):
        while journal.backlog():
            await trio.sleep(journal_writer.LINGER_SECONDS / 4)


async def until_committed(journal: Journal, batch_id: str) -> None:
    with trio.fail_after(5):
        while not committed(journal.path, batch_id):
            await trio.sleep(0.01)


async def test_a_group_started_while_the_loop_is_crowded_is_committed_on_the_loop(tmp_path: Path) -> None:
    """With several calls in flight the loop has no core to spare: the group is committed
    on the loop when due, not handed to the thread (which would fight it for the GIL)."""
    seen: list[int] = []
    async with writing(tmp_path, crowded=True) as journal:
        for n in range(5):
            ended(journal, f"read{n}")
        where_committed(journal, seen)
        assert journal.backlog() == 6  # nobody woken: the loop keeps the group
        await until_taken(journal)
        assert seen == [threading.get_ident()]  # the loop's thread
        assert all(committed(journal.path, f"read{n}") for n in range(5))


async def test_a_group_started_while_the_loop_serves_one_call_is_the_threads(tmp_path: Path) -> None:
    seen: list[int] = []
    async with writing(tmp_path, crowded=False) as journal:
        where_committed(journal, seen)
        journal.flush()
        assert seen and seen != [threading.get_ident()]


async def test_a_large_group_is_the_threads_even_when_the_loop_is_crowded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood of big results is never committed in one go on the loop."""
    monkeypatch.setattr(journal_writer, "LOOP_COMMIT_BYTES", 1000)
    seen: list[int] = []
    async with writing(tmp_path, crowded=True) as journal:
        ended(journal, "big", content="x" * 5000)
        where_committed(journal, seen)
        await until_taken(journal)
        journal.flush()
        assert seen and seen != [threading.get_ident()] and committed(journal.path, "big")


async def test_a_group_left_by_a_stopped_loop_task_is_committed_by_the_thread(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        async with trio.open_nursery() as nursery:
            journal.bind_nursery(nursery, lambda: True)
            await trio.testing.wait_all_tasks_blocked()
            ended(journal, "left")
            nursery.cancel_scope.cancel()  # the daemon stopping before the group was due
        await until_committed(journal, "left")
    finally:
        journal.close()


@pytest.mark.parametrize("crowded", [True, None], ids=["on the loop", "on the thread"])
async def test_a_write_raising_what_sqlite_does_not_fails_alone_and_the_writer_goes_on(
    tmp_path: Path, crowded: bool | None
) -> None:
    """A value SQLite cannot take raises OverflowError, not an SQLite error: the write fails
    alone, its group is committed, and neither the loop nor the writer thread dies (a dead
    thread would leave every later write of every user queued for ever)."""
    async with writing(tmp_path, crowded=crowded) as journal:
        ended(journal, "before")
        failed = journal._write(broken)
        ended(journal, "with")
        await until_taken(journal)
        journal.flush()
        assert isinstance(failed.error, OverflowError)
        assert committed(journal.path, "before") and committed(journal.path, "with")
        ended(journal, "next")
        await until_committed(journal, "next")


def failing(times: int, error: Exception, calls: list[int]) -> Callable[[sqlite3.Connection], None]:
    """A write that fails ``times`` times with ``error``, then inserts a batch row ``owed``."""

    def write(db: sqlite3.Connection) -> None:
        calls.append(1)
        if len(calls) <= times:
            raise error
        ended_row = ("owed", 1, 1, 1, "t", None, 0.0, 0.0, "finished", "d", "", 0)
        db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", ended_row)

    return write


async def test_an_owed_write_that_failed_is_tried_again_until_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write recording what happened (a result, a batch's end) that fails as a full disk
    makes it fail is committed later, alone; its commit still says it failed at first."""
    monkeypatch.setattr(journal_writer, "OWED_RETRY_SECONDS", 0.02)
    calls: list[int] = []
    async with writing(tmp_path, crowded=None) as journal:
        commit = journal._write(failing(2, sqlite3.OperationalError("database or disk is full"), calls), owed=True)
        ended(journal, "later")  # a write after it is not held back by it
        await until_committed(journal, "later")
        await until_committed(journal, "owed")
        assert len(calls) == 3  # failed, failed again (the disk still full), committed
        assert isinstance(commit.error, sqlite3.OperationalError)


async def test_a_write_sqlite_refuses_as_such_is_not_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_writer, "OWED_RETRY_SECONDS", 0.01)
    calls: list[int] = []
    async with writing(tmp_path, crowded=None) as journal:
        journal._write(failing(1, sqlite3.IntegrityError("UNIQUE constraint failed"), calls), owed=True)
        journal.flush()
        await trio.sleep(0.1)
        assert len(calls) == 1 and not committed(journal.path, "owed")


async def test_owed_writes_are_tried_a_last_time_when_the_journal_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_writer, "OWED_RETRY_SECONDS", 3600)  # never due while open
    calls: list[int] = []
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    journal._write(failing(1, sqlite3.OperationalError("disk I/O error"), calls), owed=True)
    journal.flush()
    assert len(calls) == 1 and not committed(journal.path, "owed")
    journal.close()
    assert len(calls) == 2 and committed(journal.path, "owed")


async def test_past_their_bound_the_oldest_owed_writes_are_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_writer, "OWED_RETRY_SECONDS", 3600)
    monkeypatch.setattr(journal_writer, "OWED_MAX_WRITES", 2)
    journal = Journal.open_in(tmp_path)
    journal.start_writer()
    try:
        for _ in range(3):
            journal._write(failing(10, sqlite3.OperationalError("database or disk is full"), []), owed=True)
        journal.flush()
        assert journal._writer is not None and journal._writer.owed_given_up == 1
    finally:
        journal.close()
