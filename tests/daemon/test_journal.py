"""The journal on its own: write discipline, recovery, discard, retention, schema guards."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import pytest
import trio

from toold_daemon.records import journal as journal_module
from toold_daemon.records import journal_pruning, server_connections
from toold_daemon.records.journal import Journal, JournalError
from toold_daemon.records.journal_recovery import DISCARDED, INTERRUPTED
from toold_daemon.records.journal_schema import SCHEMA_VERSION
from toold_daemon.records.stored_batches import Submission, fingerprint
from toold_daemon.undo.images import Change, Image
from toold_protocol import Identity, PlannedCall, ToolCall, ToolErrorInfo, ToolResult, encode_value

ME = Identity(uid=1000, gid=1000, pid=42)


def calls(n: int) -> list[ToolCall]:
    return [
        ToolCall(call_id=f"c{i}", name="write_file", arguments=msgspec.Raw(encode_value({"path": f"{i}"})))
        for i in range(n)
    ]


def record(journal: Journal, batch_id: str, n: int, resolved: dict[int, ToolResult] | None = None) -> None:
    cs = calls(n)
    planned = [
        PlannedCall(
            index=i,
            call_id=c.call_id,
            name=c.name,
            disposition="resolved" if resolved and i in resolved else "run",
            result=(resolved or {}).get(i),
        )
        for i, c in enumerate(cs)
    ]
    journal.record_batch(Submission(batch_id, ME, "t", "turn", fingerprint(cs), cs, planned))


def ok(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, ok=True, content="done", data={"n": 1}, duration_ms=1.5)


def test_round_trip_of_everything_recorded(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    bad = ToolResult(
        call_id="c1", ok=False, content="Error", error=ToolErrorInfo(type="BadArgs", code="BAD_ARGS", message="m")
    )
    record(journal, "b", 3, resolved={1: bad})
    journal.started("b", 0)
    journal.result("b", 0, ok("c0"))
    journal.started("b", 2)
    journal.result("b", 2, ok("c2"), final_state="finished")
    stored = journal.load("b")
    assert stored is not None and stored.state == "finished" and stored.finished is not None
    assert stored.results == [ok("c0"), bad, ok("c2")]
    assert [c.call_id for c in stored.calls] == ["c0", "c1", "c2"] and stored.turn_id == "turn"
    assert stored.fingerprint == fingerprint(calls(3)) and stored.identity == ME
    assert journal.recover() == []


def test_crash_recovery_marks_started_calls_interrupted_and_leaves_the_rest_pending(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    record(journal, "b", 3)
    journal.started("b", 0)
    journal.result("b", 0, ok("c0"))
    journal.started("b", 1)  # the daemon dies here, with call 1 running
    journal.close()
    reopened = Journal.open_in(tmp_path)
    assert reopened.recover() == ["b"]
    stored = reopened.load("b")
    assert stored is not None and stored.state == "interrupted"
    assert stored.results[0] == ok("c0")
    assert stored.results[1] is not None and stored.results[1].error is not None
    assert stored.results[1].error.code == "INTERRUPTED" and stored.results[1].error.message == INTERRUPTED
    assert stored.results[2] is None
    assert reopened.recover() == ["b"]  # idempotent: nothing is added twice
    assert reopened.load("b") == stored
    reopened.discard("b")
    discarded = reopened.load("b")
    assert discarded is not None and discarded.state == "cancelled"
    assert discarded.results[2] is not None and discarded.results[2].error is not None
    assert discarded.results[2].error.message == DISCARDED


def test_a_batch_that_only_lacked_its_final_state_is_finished_by_recovery(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    record(journal, "b", 1)
    journal.result("b", 0, ok("c0"))
    assert journal.recover() == []
    stored = journal.load("b")
    assert stored is not None and stored.state == "finished"


async def test_prune_keeps_recent_and_unfinished_batches(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    record(journal, "old", 1)
    journal.result("old", 0, ok("c0"), final_state="finished")
    record(journal, "running", 1)
    time.sleep(0.02)
    assert await journal.prune(older_than_seconds=3600) == []
    assert await journal.prune(older_than_seconds=0.01, uid=4242) == []
    assert await journal.prune(older_than_seconds=0.01) == ["old"]
    assert journal.load("old") is None and journal.load("running") is not None
    assert [row[0] for row in journal.summaries(uid=ME.uid)] == ["running"]


def test_schema_and_lock_guards(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    with pytest.raises(JournalError, match="another toold"):
        Journal.open_in(tmp_path)
    journal.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(JournalError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Journal.open_in(tmp_path)
    with pytest.raises(JournalError, match="does not exist"):
        Journal.open_in(tmp_path / "missing")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(JournalError, match="a-file is not a directory"):
        Journal.open_in(tmp_path / "a-file")
    assert (tmp_path / "journal.sqlite3").stat().st_mode & 0o777 == 0o600


def test_servers_connections_are_kept_newest_first_and_trimmed_per_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that connects in a loop keeps only its newest rows; another server's and
    another uid's rows are not touched by its trimming."""
    monkeypatch.setattr(server_connections, "TRIM_EVERY", 3)
    journal = Journal.open_in(tmp_path, server_connections_kept=5)
    them = Identity(uid=2000, gid=2000, pid=43)
    for port in range(1, 31):
        journal.server_connection("mcp:loop", ME, {"host": "h", "port": port, "protocol": "connect", "sent": port})
    journal.server_connection("mcp:loop", them, {"host": "theirs", "port": 1, "protocol": "socks"})
    journal.server_connection("mcp:quiet", ME, {"host": "q", "port": 9, "protocol": "http", "refused": "denied"})
    loop = journal.server_connections(uid=ME.uid, server="mcp:loop", limit=100)
    assert [c.port for c in loop] == [30, 29, 28, 27, 26]  # trimmed at the 30th row: the newest 5
    assert loop[0].sent == 30 and loop[0].protocol == "connect" and loop[0].uid == ME.uid
    quiet = journal.server_connections(uid=ME.uid, server="mcp:quiet", limit=100)
    assert [(c.host, c.refused) for c in quiet] == [("q", "denied")]
    assert [c.host for c in journal.server_connections(uid=them.uid, server=None, limit=100)] == ["theirs"]
    assert len(journal.server_connections(uid=None, server=None, limit=100)) == 7
    assert len(journal.server_connections(uid=None, server=None, limit=2)) == 2


async def test_prune_removes_servers_connections_that_ended_before_the_cutoff(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    them = Identity(uid=2000, gid=2000, pid=43)
    for who in (ME, them):
        journal.server_connection("mcp:s", who, {"host": "h", "port": 1, "protocol": "connect"})
    time.sleep(0.02)
    await journal.prune(older_than_seconds=3600)
    assert len(journal.server_connections(uid=None, server=None, limit=10)) == 2
    await journal.prune(older_than_seconds=0.01, uid=them.uid)
    assert [c.uid for c in journal.server_connections(uid=None, server=None, limit=10)] == [ME.uid]
    await journal.prune(older_than_seconds=0.01)
    assert journal.server_connections(uid=None, server=None, limit=10) == []


def test_a_journal_of_the_previous_schema_gains_the_servers_connections(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    record(journal, "kept", 1)
    journal.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    _back_to_schema_5(db)
    db.execute("DROP TABLE server_connections")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    journal = Journal.open_in(tmp_path)
    journal.server_connection("mcp:s", ME, {"host": "h", "port": 1, "protocol": "connect"})
    assert [c.host for c in journal.server_connections(uid=ME.uid, server=None, limit=10)] == ["h"]
    assert journal.load("kept") is not None


def _back_to_schema_5(db: sqlite3.Connection) -> None:
    """What schemas 6 to 8 added, taken away again (a journal written before them)."""
    for column in ("after_mode", "uid", "gid", "xattrs", "moved_to"):
        db.execute(f"ALTER TABLE changes DROP COLUMN {column}")
    db.execute("DROP INDEX batches_by_uid_newest")
    db.execute("DROP INDEX batches_by_uid_age")
    db.execute("ALTER TABLE batches DROP COLUMN bytes")
    db.execute("PRAGMA user_version = 5")


def test_a_journal_of_schema_5_counts_what_its_batches_hold(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    record(journal, "old", 1)
    journal.result("old", 0, ToolResult(call_id="c0", ok=True, content="x" * 1000, display="x" * 1000))
    journal.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    written = db.execute("SELECT bytes FROM batches WHERE batch_id = 'old'").fetchone()[0]
    _back_to_schema_5(db)
    db.commit()
    db.close()
    journal = Journal.open_in(tmp_path)
    counted = journal._db.execute("SELECT bytes FROM batches WHERE batch_id = 'old'").fetchone()[0]
    assert counted == written >= 1000  # the migration counts what the writes counted
    assert journal.held_by(ME.uid) == counted


def test_a_uids_connections_are_listed_through_an_index_not_a_scan_of_everyones(tmp_path: Path) -> None:
    """Any user may list (``toolctl watch`` does every few seconds): their query must not
    read every other user's rows on the daemon's loop."""
    journal = Journal.open_in(tmp_path)
    plans = {}
    for server in (None, "mcp:s"):
        captured: list[str] = []
        journal._db.set_trace_callback(captured.append)
        journal.server_connections(uid=ME.uid, server=server, limit=5)
        journal._db.set_trace_callback(None)
        query = next(q for q in captured if "FROM server_connections" in q)
        plans[server] = " ".join(row[-1] for row in journal._db.execute(f"EXPLAIN QUERY PLAN {query}"))
    assert all("USING INDEX" in plan and "TEMP B-TREE" not in plan for plan in plans.values()), plans


def test_a_uids_batches_are_listed_newest_first_through_an_index(tmp_path: Path) -> None:
    """Any user may list their batches as often as they like: the newest first must come
    from an index, not from sorting every batch of theirs on the daemon's loop."""
    journal = Journal.open_in(tmp_path)
    for i in range(3):
        record(journal, f"b{i}", 1)
    captured: list[str] = []
    journal._db.set_trace_callback(captured.append)
    listed = journal.summaries(uid=ME.uid, limit=2)
    journal._db.set_trace_callback(None)
    assert [row[0] for row in listed] == ["b2", "b1"]
    query = next(q for q in captured if "FROM batches" in q)
    plan = " ".join(row[-1] for row in journal._db.execute(f"EXPLAIN QUERY PLAN {query}"))
    assert "batches_by_uid_newest" in plan and "TEMP B-TREE" not in plan, plan


def test_a_journal_closed_cleanly_opens_without_reading_every_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-file check reads every page (seconds for a large journal after a reboot):
    a journal whose last daemon closed it has no write-ahead log left and is not checked."""
    journal = Journal.open_in(tmp_path)
    record(journal, "b", 2)
    journal.close()
    assert not (tmp_path / "journal.sqlite3-wal").exists()

    def never(db: sqlite3.Connection) -> bool:
        raise AssertionError("a cleanly closed journal was checked page by page")

    monkeypatch.setattr(journal_module, "intact", never)
    reopened = Journal.open_in(tmp_path)
    assert reopened.load("b") is not None
    reopened.close()


def test_a_damaged_journal_a_crash_left_behind_is_refused(tmp_path: Path) -> None:
    journal = Journal.open_in(tmp_path)
    for i in range(60):
        record(journal, f"b{i}", 1)
        journal.result(f"b{i}", 0, ToolResult(call_id="c0", ok=True, content="x" * 4000), final_state="finished")
    journal.close()
    path = tmp_path / "journal.sqlite3"
    pages = path.stat().st_size // 4096
    with path.open("r+b") as file:  # a page in the middle (the results' text) turns to zeros
        file.seek(pages // 2 * 4096)
        file.write(bytes(4096))
    crashed = sqlite3.connect(path)  # a daemon that died mid-run: its log is still there
    crashed.execute("UPDATE batches SET client_name = 'x' WHERE batch_id = 'b0'")
    assert (tmp_path / "journal.sqlite3-wal").exists()
    try:
        with pytest.raises(JournalError, match="damaged"):
            Journal.open_in(tmp_path)
    finally:
        crashed.close()


def _finished_long_ago(journal: Journal, batch_id: str, uid: int) -> None:
    planned = [PlannedCall(index=0, call_id="c0", name="write_file", disposition="run")]
    submission = Submission(batch_id, Identity(uid=uid, gid=uid, pid=1), "t", None, "f", calls(1), planned)
    journal.record_ended(submission, [ok("c0")], "finished")
    journal._db.execute("UPDATE batches SET finished = finished - 7200 WHERE batch_id = ?", (batch_id,))


async def test_prune_deletes_in_turns_and_keeps_the_shares_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_pruning, "PRUNE_CHUNK", 3)
    journal = Journal.open_in(tmp_path)
    for i in range(7):
        _finished_long_ago(journal, f"mine{i}", ME.uid)
        _finished_long_ago(journal, f"theirs{i}", 2000)
    held = journal.held_by(2000)
    assert held > 0
    assert sorted(await journal.prune(older_than_seconds=3600, uid=ME.uid)) == [f"mine{i}" for i in range(7)]
    assert journal.held_by(ME.uid) == 0 and journal.held_by(2000) == held
    assert len(await journal.prune(older_than_seconds=3600)) == 7
    assert journal.held_by(2000) == 0
    journal.close()


async def test_pruning_while_serving_takes_turns_with_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the writer thread, each turn is the thread's and the loop runs between them."""
    monkeypatch.setattr(journal_pruning, "PRUNE_CHUNK", 2)
    journal = Journal.open_in(tmp_path)
    for i in range(9):
        _finished_long_ago(journal, f"b{i}", ME.uid)
    journal.start_writer()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        removed = await journal.prune(older_than_seconds=3600)
        nursery.cancel_scope.cancel()
    assert len(removed) == 9 and journal.held_by(ME.uid) == 0
    assert ticks >= 5  # the loop ran between the five turns
    journal.close()


async def test_the_kept_pre_images_are_read_off_the_loop(tmp_path: Path) -> None:
    """Every pre-image still named, read on a thread of its own (200,000 changes took the
    loop 0.8-1 s with SQLite's DISTINCT)."""
    journal = Journal.open_in(tmp_path)
    record(journal, "w", 2)
    before = [Image(path=f"f{i}", kind="file", mode=0o644, hash=f"h{i % 2}") for i in range(3)]
    changes = [Change(before=image, after_kind="file", after_hash="after") for image in before]
    journal.result("w", 0, ok("c0"), changes=changes)
    journal.result("w", 1, ok("c1"), changes=[Change(before=Image(path="new", kind="missing"), after_kind="file")])
    readers: list[int] = []
    read = journal._read_kept_hashes

    def spied() -> set[str]:
        readers.append(threading.get_ident())
        return read()

    journal._read_kept_hashes = spied  # type: ignore[method-assign]
    assert await journal.kept_hashes() == {"h0", "h1"}  # no pre-image for a path that did not exist
    assert readers and readers[0] != threading.get_ident()
    journal.close()


async def test_a_users_prune_reads_only_their_own_batches(tmp_path: Path) -> None:
    """Anyone may ask to prune, as often as they like: each ask must cost an index probe
    into their own batches, not a scan of everyone's."""
    journal = Journal.open_in(tmp_path)
    captured: list[str] = []
    journal._db.set_trace_callback(captured.append)
    await journal.prune(older_than_seconds=0, uid=ME.uid)
    journal._db.set_trace_callback(None)
    query = next(q for q in captured if q.startswith("SELECT batch_id, uid, bytes FROM batches"))
    plan = " ".join(row[-1] for row in journal._db.execute(f"EXPLAIN QUERY PLAN {query}"))
    assert "batches_by_uid_age (uid=? AND finished<?)" in plan, plan
    journal.close()


def test_a_journal_of_schema_7_keeps_its_changes_with_no_mode_to_compare(tmp_path: Path) -> None:
    """Changes recorded before the journal kept the modes a batch left, and the group and
    attributes a path had, read back as -1 and none (an undo neither compares nor gives
    them back); new ones keep them."""
    journal = Journal.open_in(tmp_path)
    record(journal, "old", 1)
    acl = {"system.posix_acl_access": b"\x02\x00\x00\x00", "user.origin": b"\xffhere"}
    before = Image(path="f", kind="file", mode=0o640, hash="was", uid=4300, gid=4242, xattrs=acl)
    made = Change(before=before, after_kind="file", after_hash="h", after_mode=0o640)
    journal.result("old", 0, ok("c0"), changes=[made])
    assert [(c.after_mode, c.uid, c.gid, c.xattrs) for c in journal.changes("old")] == [(0o640, 4300, 4242, acl)]
    journal.close()
    db = sqlite3.connect(tmp_path / "journal.sqlite3")
    for column in ("after_mode", "uid", "gid", "xattrs", "moved_to"):
        db.execute(f"ALTER TABLE changes DROP COLUMN {column}")
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()
    journal = Journal.open_in(tmp_path)
    old = [(c.path, c.after_hash, c.after_mode, c.uid, c.gid, c.xattrs, c.moved_to) for c in journal.changes("old")]
    assert old == [("f", "h", -1, -1, -1, {}, "")]
    record(journal, "new", 1)
    moved = Change(before=Image(path="d", kind="unknown", note="large", moved_to="e"), after_kind="absent")
    journal.result("new", 0, ok("c0"), changes=[made, moved])
    new = [(c.after_mode, c.uid, c.gid, c.xattrs, c.moved_to) for c in journal.changes("new")]
    assert new == [(0o640, 4300, 4242, acl, ""), (-1, -1, -1, {}, "e")]
    journal.close()


def test_the_attributes_kept_for_undo_count_in_the_batchs_share(tmp_path: Path) -> None:
    """Extended attributes kept with a pre-image (up to 16 KiB a path) are the user's
    bytes in the journal, as the pre-images are: a batch's share counts them."""
    journal = Journal.open_in(tmp_path)
    xattrs = {"user.big": b"x" * 10_000}
    for batch_id, kept in (("bare", {}), ("dressed", xattrs)):
        record(journal, batch_id, 1)
        before = Image(path="f", kind="file", mode=0o640, hash="was", uid=0, gid=0, xattrs=kept)
        journal.result(batch_id, 0, ok("c0"), changes=[Change(before=before, after_kind="absent")])
    journal.flush()
    share = dict(journal._db.execute("SELECT batch_id, bytes FROM batches"))
    assert share["dressed"] - share["bare"] == len(msgspec.msgpack.encode(xattrs))
    journal.close()
