"""Each uid's share of the journal on disk: what its batches hold is counted, and past
``max_bytes_per_uid`` its oldest finished batches are pruned, never another uid's."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.records.journal import Journal
from toold_daemon.records.journal_shares import Shares
from toold_daemon.records.stored_batches import Submission, fingerprint
from toold_daemon.records.upkeep import keep_journal_forever
from toold_daemon.undo.ledger import UndoLedger
from toold_daemon.undo.store import UndoStore
from toold_protocol import Identity, PlannedCall, ToolCall, ToolResult, encode_value

MB = 1024 * 1024
ATTACKER = Identity(uid=2001, gid=2001, pid=7)
BYSTANDER = Identity(uid=2002, gid=2002, pid=8)


def read_batch(journal: Journal, batch_id: str, who: Identity, size: int) -> None:
    """A read-only batch of one call whose result holds ``size`` bytes, journaled as ended."""
    call = ToolCall(call_id="c0", name="read_file", arguments=msgspec.Raw(encode_value({"path": "f"})))
    plan = PlannedCall(index=0, call_id="c0", name="read_file", disposition="run")
    submission = Submission(batch_id, who, "t", None, fingerprint([call]), [call], [plan])
    result = ToolResult(call_id="c0", ok=True, content="r" * size, display="r" * size)
    journal.record_ended(submission, [result], "finished")


def held_on_disk(journal_path: Path) -> dict[int, int]:
    db = sqlite3.connect(journal_path)
    try:
        return dict(db.execute("SELECT uid, SUM(bytes) FROM batches GROUP BY uid").fetchall())
    finally:
        db.close()


def batch_ids(journal: Journal, who: Identity) -> list[str]:
    return sorted(row[0] for row in journal.summaries(uid=who.uid))


def test_a_uid_past_its_share_loses_its_oldest_batches_and_nobody_elses(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path, max_bytes_per_uid=MB)
    read_batch(journal, "bystander-0", BYSTANDER, 200_000)
    for n in range(40):  # 4 MB, four times the share
        read_batch(journal, f"attack-{n:02d}", ATTACKER, 100_000)
        assert journal.held_by(ATTACKER.uid) <= MB + 100_000
    kept = batch_ids(journal, ATTACKER)
    assert kept[-1] == "attack-39" and "attack-00" not in kept  # the oldest went first
    assert 7 <= len(kept) <= 11, kept
    assert batch_ids(journal, BYSTANDER) == ["bystander-0"]
    assert journal.pruned_for_space == 40 - len(kept)
    journal.close()
    on_disk = held_on_disk(tmp_path / "journal.sqlite3")
    reopened = Journal.open_in(tmp_path, max_bytes_per_uid=MB)
    assert reopened.held_by(ATTACKER.uid) == on_disk[ATTACKER.uid] <= MB + 100_000
    assert reopened.held_by(BYSTANDER.uid) == on_disk[BYSTANDER.uid] >= 200_000


def test_nothing_runs_is_pruned_and_a_uid_with_nothing_finished_is_not_looked_at_every_write(
    tmp_path: Path,
) -> None:
    journal = Journal.open_in(tmp_path, max_bytes_per_uid=MB)
    calls = [
        ToolCall(call_id=f"c{i}", name="write_file", arguments=msgspec.Raw(encode_value({"content": "w" * 300_000})))
        for i in range(5)
    ]
    plans = [PlannedCall(index=i, call_id=f"c{i}", name="write_file", disposition="run") for i in range(5)]
    queries: list[str] = []
    journal._db.set_trace_callback(queries.append)
    journal.record_batch(Submission("running", ATTACKER, "t", None, fingerprint(calls), calls, plans))  # 1.5 MB
    for n in range(5):
        journal.result("running", n, ToolResult(call_id=f"c{n}", ok=True, content="x" * 1000, display="x" * 1000))
    journal._db.set_trace_callback(None)
    assert batch_ids(journal, ATTACKER) == ["running"]  # past its share, and still all there
    looks = [q for q in queries if "state IN ('finished', 'cancelled')" in q]
    assert len(looks) == 1, looks  # once, not at every write past the share


async def test_with_the_writer_thread_the_share_holds_and_the_counts_match_the_rows(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path, max_bytes_per_uid=MB)
    journal.start_writer()
    for n in range(60):
        read_batch(journal, f"attack-{n:02d}", ATTACKER, 100_000)
        if n % 10 == 0:
            await trio.sleep(0.02)  # the writer commits meanwhile, as under a real flood
    journal.flush()
    journal.flush()  # the last prune's delete, queued by the last write's count
    rows = held_on_disk(tmp_path / "journal.sqlite3")
    assert rows[ATTACKER.uid] == journal.held_by(ATTACKER.uid) <= MB + 100_000
    journal.close()


def test_a_pre_image_kept_again_is_fresh_and_stays_through_a_collection(tmp_path: Path) -> None:
    store = UndoStore(tmp_path / "undo")
    old, again = store.put(b"old bytes"), store.put(b"kept again")
    hour_ago = time.time() - 3600
    for name in (old, again):
        os.utime(store.directory / name, (hour_ago, hour_ago))
    store.put(b"kept again")  # a new batch names it: as new as if it had just been written
    assert store.collect(set(), recent_seconds=600) == 1
    assert store.get(again) == b"kept again" and store.get(old) is None


async def test_the_upkeep_applies_retention_and_removes_the_pruned_batches_pre_images(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    journal = Journal.open_in(tmp_path)
    store = UndoStore.open_in(tmp_path)
    ledger = UndoLedger(store, journal, 64 * MB)
    read_batch(journal, "old", ATTACKER, 10)
    journal._db.execute("UPDATE batches SET finished = finished - 40 * 86400 WHERE batch_id = 'old'")
    orphan = store.put(b"a pre-image no batch names any more")
    past = time.time() - 3600
    os.utime(store.directory / orphan, (past, past))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_journal_forever, journal, ledger, 30.0)
        for _ in range(500):  # its reads run on threads: real time, while the mock clock jumps
            if store.get(orphan) is None:
                break
            await trio.to_thread.run_sync(time.sleep, 0.01)
        nursery.cancel_scope.cancel()
    assert batch_ids(journal, ATTACKER) == []  # at its first look, right after the start
    assert store.get(orphan) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([ATTACKER.uid, BYSTANDER.uid]), st.integers(1, 400_000), st.booleans()),
        min_size=1,
        max_size=120,
    )
)
def test_shares_never_choose_a_batch_twice_and_end_in_step_with_the_rows(
    writes: list[tuple[int, int, bool]],
) -> None:
    """A model of the journal: rows are committed late (a write commits only when the
    writer gets to it); whatever the interleaving, no batch is chosen twice, and once
    every queued write is committed each uid's total is what its rows hold."""
    shares = Shares(MB, {})
    committed: dict[str, tuple[int, int, float]] = {}  # batch -> (uid, bytes, finished)
    queued: list[tuple[str, str, int, int, float]] = []  # ("insert"|"delete", batch, uid, bytes, finished)
    chosen_ever: set[str] = set()

    def older(uid: int, after: float, before: float, limit: int) -> list[tuple[str, int, float]]:
        rows = sorted((f, b, n) for b, (u, n, f) in committed.items() if u == uid and after < f < before)
        return [(b, n, f) for f, b, n in rows[:limit]]

    def commit_queue() -> None:
        for action, batch, uid, size, finished in queued:
            if action == "insert":
                committed[batch] = (uid, size, finished)
            else:
                committed.pop(batch, None)
        queued.clear()

    for n, (uid, size, writer_catches_up) in enumerate(writes):
        batch = f"b{n:03d}"
        shares.recorded(batch, uid, size, ended_at=float(n))
        queued.append(("insert", batch, uid, size, float(n)))
        if shares.over(uid):
            chosen = shares.choose(uid, older)
            assert not chosen_ever & set(chosen), "a batch was chosen twice"
            chosen_ever.update(chosen)
            queued.extend(("delete", b, uid, 0, 0.0) for b in chosen)
        assert shares.held_by(uid) <= MB + size  # within the share but for the batch just written
        if writer_catches_up:
            commit_queue()
    commit_queue()
    for uid in (ATTACKER.uid, BYSTANDER.uid):
        assert shares.held_by(uid) == sum(n for u, n, _ in committed.values() if u == uid)


def test_batches_chosen_from_memory_are_not_offered_again_by_the_database_before_their_delete() -> None:
    shares = Shares(MB, {})
    committed: dict[str, tuple[int, float]] = {}

    def older(uid: int, after: float, before: float, limit: int) -> list[tuple[str, int, float]]:
        return [(b, n, f) for b, (n, f) in sorted(committed.items(), key=lambda kv: kv[1][1]) if after < f < before]

    for n in range(4):  # 1.2 MB, each committed as it comes
        shares.recorded(f"b{n}", ATTACKER.uid, 300_000, ended_at=float(n))
        committed[f"b{n}"] = (300_000, float(n))
    first = shares.choose(ATTACKER.uid, older)
    assert first == ["b0", "b1"]  # their deletes are queued, not committed: the rows are still there
    for n in (4, 5):
        shares.recorded(f"b{n}", ATTACKER.uid, 300_000, ended_at=float(n))
    assert shares.over(ATTACKER.uid)
    assert shares.choose(ATTACKER.uid, older) == ["b2", "b3"]


async def test_the_upkeep_survives_an_undo_store_it_cannot_read(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A store it cannot list (removed, or no longer its user's after a privilege drop)
    costs a warning, not the daemon: the upkeep runs in the daemon's own nursery."""
    journal = Journal.open_in(tmp_path)
    store = UndoStore.open_in(tmp_path)
    ledger = UndoLedger(store, journal, 64 * MB)
    store.directory.rmdir()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_journal_forever, journal, ledger, 30.0)
        for _ in range(500):
            if "cannot remove the undo pre-images" in caplog.text:
                break
            await trio.to_thread.run_sync(time.sleep, 0.01)
        await trio.sleep(600)  # looks on, every minute
        nursery.cancel_scope.cancel()
    assert "cannot remove the undo pre-images" in caplog.text
