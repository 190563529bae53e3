"""The journal: batches, their calls in order, and results, in SQLite (WAL mode).

Once the daemon serves, writes run on the writer thread (``journal_writer``); the
service and executor wait for those that must be durable before they act.

Write discipline, kept by the service and executor:

1. the batch, its calls and any pre-resolved results, in one transaction, before
   ``batch_accepted`` is sent;
2. a side-effecting call's ``started`` mark before the tool runs (a read-only call needs
   none: after a crash it has no result, stays pending, and resume runs it again);
3. a call's result before the next call starts and before the result is sent;
4. the batch's final state (with the last result, in the same transaction).

A batch of read-only calls is the exception: it is journaled once, when it has ended
(``record_ended``), and answered without waiting for that commit. After a crash it may
therefore be unknown; submitting it again under its id runs the reads again, which has
no effect beyond reading.

A call with a ``started`` mark and no result was running when the daemon died: on
the next start it gets an "interrupted" error result and is never run again, except
an undo's: an undo the daemon died in is run again at the next start, resuming, so that
it finishes (``undos_to_finish``). Calls that never started wait for ``resume`` or
``discard``.

Each uid's share is bounded (``max_bytes_per_uid``): every batch row counts what the
batch holds (its calls' arguments, its results, the pre-images kept for undo), and a
uid past its share has its oldest finished batches pruned down to three quarters of it,
in short writes on the writer thread (``journal_shares`` chooses them). Other uids'
batches are never touched; what runs is bounded by the daemon's limits on running
batches, not here.

``synchronous = "normal"`` (default) survives a daemon crash (WAL: a committed
transaction is in the log before the call returns); ``"full"`` also fsyncs each
commit so it survives power loss, at the cost of one fsync per commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

from toold_protocol import (
    BatchState,
    Identity,
    ServerConnection,
    ToolResult,
)

from ..undo.images import Change
from . import journal_pruning, journal_recovery, journal_rows
from . import server_connections as connection_rows
from .journal_schema import SCHEMA_VERSION, NewerSchema, intact, migrate
from .journal_shares import Shares
from .journal_writer import Commit, JournalWriteFailed, JournalWriter, Rows, Write
from .state_files import StateFileRefused, refuse_links
from .stored_batches import StoredBatch, StoredChange, Submission

JOURNAL_NAME = "journal.sqlite3"
RECOVERY_NAME = "last-recovery.json"  # what the last start found and did (``toold doctor``)
DEFAULT_MAX_BYTES_PER_UID = 1024 * 1024 * 1024


class JournalError(Exception):
    """The journal cannot be used (corrupt, newer schema, unreadable). The message says why."""


class Journal:
    def __init__(
        self,
        path: Path,
        *,
        synchronous: Literal["normal", "full"] = "normal",
        server_connections_kept: int = connection_rows.KEPT_PER_SERVER,
        max_bytes_per_uid: int = DEFAULT_MAX_BYTES_PER_UID,
    ) -> None:
        self.path = path
        self.server_connections_kept = server_connections_kept
        #: Batches pruned because their uid was past its share, since the journal opened.
        self.pruned_for_space = 0
        self._lock_fd: int | None = None
        self._writer: JournalWriter | None = None
        self.interrupted_calls = 0  # by the last recover()
        self.undos_to_finish: list[str] = []  # undos a crash cut short, by the last recover()
        self._server_rows_since_trim: dict[tuple[str, int], int] = {}
        crashed = Path(f"{path}-wal").exists()  # a clean close removes the log; a crash leaves it
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            if crashed and not intact(self._db):
                raise JournalError(f"{path}: the journal is damaged (quick_check failed); move it aside to start fresh")
            held = dict(self._db.execute("SELECT uid, SUM(bytes) FROM batches GROUP BY uid").fetchall())
            self._shares = Shares(max_bytes_per_uid, held)
            # The writer thread's, opened now: after a privilege drop it could not be.
            self._writer_db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._writer_db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._writer_db.execute("PRAGMA foreign_keys=ON")
            # Long reads off the loop (``kept_hashes``), one at a time, on a worker thread;
            # its files opened now by a first read, like the others' before a privilege drop.
            self._reader_db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._reader_db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            self._reading = threading.Lock()
            # The writer thread's checkpoints, on their own: commits go on during one.
            self._checkpoint_db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._checkpoint_db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{path}: cannot use the journal: {exc}; move it aside to start fresh") from None
        os.chmod(path, 0o600)

    @classmethod
    def open_in(
        cls,
        state_dir: Path,
        *,
        synchronous: Literal["normal", "full"] = "normal",
        server_connections_kept: int = connection_rows.KEPT_PER_SERVER,
        max_bytes_per_uid: int = DEFAULT_MAX_BYTES_PER_UID,
    ) -> Journal:
        """Open the journal of ``state_dir``, holding an exclusive lock on the directory: a
        second daemon's recovery would otherwise mark the first one's running batches interrupted."""
        if not state_dir.is_dir():
            what = "is not a directory" if state_dir.exists() else "does not exist"
            raise JournalError(f"state directory {state_dir} {what}")
        path = state_dir / JOURNAL_NAME
        try:
            refuse_links(state_dir / "journal.lock", path, *(path.with_name(path.name + x) for x in ("-wal", "-shm")))
            lock = os.open(state_dir / "journal.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except (StateFileRefused, OSError) as exc:
            raise JournalError(f"cannot lock the journal in {state_dir}: {exc}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            raise JournalError(f"another toold is using the journal in {state_dir}") from None
        try:
            journal = cls(
                state_dir / JOURNAL_NAME,
                synchronous=synchronous,
                server_connections_kept=server_connections_kept,
                max_bytes_per_uid=max_bytes_per_uid,
            )
        except BaseException:
            os.close(lock)
            raise
        journal._lock_fd = lock
        return journal

    def close(self) -> None:
        """Commit what is queued, then close."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._writer_db.close()
        self._checkpoint_db.close()
        with self._reading:
            self._reader_db.close()
        self._db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _migrate(self) -> None:
        try:
            with self._transaction():
                migrate(self._db)
        except NewerSchema as exc:
            raise JournalError(
                f"{self.path}: the journal has schema version {exc.version}, newer than this daemon's "
                f"{SCHEMA_VERSION}; run a newer toold or move the journal aside"
            ) from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._db
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ how writes happen

    def start_writer(self) -> None:
        """From now on writes go to a thread of their own (``JournalWriter``) on the
        connection opened with the journal; the first one serves the loop's reads. Call
        from inside trio, after the process has settled its privileges (a thread keeps
        the ones it was born with)."""
        if self._writer is None:
            self._writer = JournalWriter(self._writer_db, trio.lowlevel.current_trio_token(), self._checkpoint_db)

    def bind_nursery(self, nursery: trio.Nursery, crowded: Callable[[], bool]) -> None:
        """Let the loop decide when and where groups of writes nobody waits for are
        committed (``JournalWriter.commit_due_forever``; ``crowded``: whether the loop
        serves several calls at once); without it, the thread's linger does."""
        if self._writer is not None:
            nursery.start_soon(self._writer.commit_due_forever, crowded)

    def _write(
        self,
        write: Write | Rows,
        *,
        awaited: bool = False,
        size: int = 0,
        long: bool = False,
        owner: int | None = None,
        owed: bool = False,
    ) -> Commit:
        """Run ``write`` in a transaction: queued on the writer thread when there is one,
        else now (a failure then raises, as it happens). ``size``: the bytes of results it
        carries, for ``backlog_bytes``; ``long``: never on the loop's thread (``submit``);
        ``owner``: the uid it is counted against while queued (``backlog_of``); ``owed``:
        it records what happened, tried again until committed (``JournalWriter.submit``)."""
        if self._writer is not None:
            return self._writer.submit(write, awaited=awaited, size=size, long=long, owner=owner, owed=owed)
        value = None
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            if isinstance(write, Rows):
                for sql, rows in write.statements:
                    db.executemany(sql, rows)
            else:
                value = write(db)
            db.execute("COMMIT")
        return Commit.done(value)

    def _write_now(self, write: Write) -> Any:
        """Run ``write`` and wait for its commit (blocking): for rare requests."""
        if self._writer is not None:
            return self._writer.run_now(write)
        return self._write(write).value

    def size(self) -> int:
        """Bytes of the journal's files (the database, its write-ahead log and index)."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(f"{self.path}{suffix}").st_size
        return total

    def backlog(self) -> int:
        """Writes queued for the writer thread and not yet taken."""
        return self._writer.backlog() if self._writer is not None else 0

    def backlog_bytes(self) -> int:
        """Bytes of results in the writes queued for the writer thread and not yet taken."""
        return self._writer.backlog_bytes() if self._writer is not None else 0

    def backlog_of(self, uid: int) -> tuple[int, int]:
        """Of those, the writes recording ``uid``'s batches, and their bytes."""
        return self._writer.backlog_of(uid) if self._writer is not None else (0, 0)

    def flush(self) -> None:
        """Wait until every queued write is committed: reads see them all after this."""
        if self._writer is not None:
            self._writer.flush()

    async def settled(self) -> None:
        """Return once every write queued so far is committed, serving meanwhile: ``flush``
        holds the event loop until the whole queue is written, which under one user's
        flood of large results took every client's calls 200 ms at a time, as often as
        that user asked for a listing. Reads made right after see those writes (pass
        ``flush=False``: a flush would wait for what was queued since)."""
        if self._writer is None:
            return
        commit = self._writer.submit(_nothing, awaited=True, long=True)
        with contextlib.suppress(JournalWriteFailed):  # logged by the writer; the read shows what is there
            await commit.durable()

    # ------------------------------------------------------------------ each uid's share

    def held_by(self, uid: int) -> int:
        """Bytes uid ``uid``'s batches hold in the journal (as written so far)."""
        return self._shares.held_by(uid)

    def _keep_within_share(self, uid: int) -> None:
        if not self._shares.over(uid):
            return
        chosen = self._shares.choose(uid, self._older_batches)
        if chosen:
            self.pruned_for_space += len(chosen)
            self._write(Rows([("DELETE FROM batches WHERE batch_id = ?", [(batch_id,) for batch_id in chosen])]))

    def _older_batches(self, uid: int, after: float, before: float, limit: int) -> list[tuple[str, int, float]]:
        return self._db.execute(  # all fetched: a cursor left open would hold a read snapshot
            "SELECT batch_id, bytes, finished FROM batches WHERE uid = ? AND state IN ('finished', 'cancelled') "
            "AND finished > ? AND finished < ? ORDER BY finished LIMIT ?",
            (uid, after, before, limit),
        ).fetchall()

    # ------------------------------------------------------------------ writes (in discipline order)

    def record_batch(self, submission: Submission, *, started: int | None = None, awaited: bool = False) -> Commit:
        """Step 1: the batch, its calls and pre-resolved results, atomically; with
        ``started``, that call's started mark too (a batch that runs at once)."""
        resolved = [(plan.index, plan.result) for plan in submission.planned if plan.result is not None]
        state: BatchState = "planned" if started is None else "running"
        return self._record(submission, state, ended=False, started=started, results=resolved, awaited=awaited)

    def record_ended(
        self,
        submission: Submission,
        results: Sequence[ToolResult | None],
        state: BatchState,
        *,
        awaited: bool = False,
    ) -> Commit:
        """A read-only batch, journaled once when it has ended: the batch with its final
        state, its calls and their results, in one write that nobody waits for (many such
        writes share one commit and one insert per table)."""
        numbered = [(index, r) for index, r in enumerate(results) if r is not None]
        return self._record(submission, state, ended=True, started=None, results=numbered, awaited=awaited)

    def _record(
        self,
        submission: Submission,
        state: BatchState,
        *,
        ended: bool,
        started: int | None,
        results: Sequence[tuple[int, ToolResult]],
        awaited: bool,
    ) -> Commit:
        """The batch's row, its calls' and the given results' rows, as one ``Rows`` write
        (so that records made one after another share an insert per table)."""
        s, now = submission, time.time()
        identity = s.identity
        batch_row = (s.batch_id, identity.uid, identity.gid, identity.pid, s.client_name, s.turn_id, now)
        finished = now if ended else None
        call_rows = [
            (*journal_rows.call_columns(s.batch_id, c, p), now if p.index == started else None)
            for c, p in zip(s.calls, s.planned, strict=True)
        ]
        result_rows = [journal_rows.result_row(s.batch_id, index, r, now) for index, r in results]
        held = sum(map(journal_rows.result_bytes, result_rows)) + sum(len(row[4]) for row in call_rows)
        commit = self._write(
            Rows(
                [
                    (journal_rows.INSERT_BATCH, [(*batch_row, finished, state, s.digest, s.workspace, held)]),
                    (journal_rows.INSERT_CALL, call_rows),
                    (journal_rows.INSERT_RESULT, result_rows),
                ]
            ),
            awaited=awaited,
            size=held,
            owner=identity.uid,
            owed=ended,  # a read-only batch that ran: what it did is owed to the journal
        )
        self._shares.recorded(s.batch_id, identity.uid, held, ended_at=now if ended else None)
        self._keep_within_share(identity.uid)
        return commit

    def started(self, batch_id: str, index: int) -> Commit:
        """Step 2: from here on, a crash means "may have happened"."""
        now = time.time()

        def write(db: sqlite3.Connection) -> None:
            db.execute("UPDATE calls SET started = ? WHERE batch_id = ? AND idx = ?", (now, batch_id, index))
            db.execute("UPDATE batches SET state = 'running' WHERE batch_id = ? AND state != 'running'", (batch_id,))

        return self._write(write, awaited=True)

    def result(
        self,
        batch_id: str,
        index: int,
        result: ToolResult,
        *,
        final_state: BatchState | None = None,
        changes: Sequence[Change] = (),
        undo_bytes: int = 0,
        awaited: bool = False,
    ) -> Commit:
        """Step 3: before the next call starts and before the result is sent (for a batch
        with side effects, which therefore waits: ``awaited``). With ``final_state`` (the
        batch's last call), the batch's end is in the same transaction; ``changes`` (what
        the call did to each path, for undo, whose pre-images took ``undo_bytes``) too."""
        now = time.time()
        row = journal_rows.result_row(batch_id, index, result, now)
        held = journal_rows.result_bytes(row) + undo_bytes
        change_rows = [
            (
                index,
                c.before.path,
                c.before.kind,
                c.before.mode,
                c.before.hash,
                c.before.note,
                c.after_kind,
                c.after_hash,
                c.after_mode,
                c.before.uid,
                c.before.gid,
                msgspec.msgpack.encode(c.before.xattrs) if c.before.xattrs else None,
                c.before.moved_to,
            )
            for c in changes
        ]
        # The attributes kept for undo are the user's bytes too (up to 16 KiB a path): they
        # count in the batch's share of the journal, as the pre-images do.
        held += sum(len(attributes) for *_, attributes, _moved_to in change_rows if attributes)

        def write(db: sqlite3.Connection) -> None:
            db.execute(journal_rows.INSERT_RESULT, row)
            db.execute("UPDATE batches SET bytes = bytes + ? WHERE batch_id = ?", (held, batch_id))
            if change_rows:
                first = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM changes WHERE batch_id = ?", (batch_id,))
                start = int(first.fetchone()[0])
                db.executemany(
                    "INSERT INTO changes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(batch_id, start + n, *row) for n, row in enumerate(change_rows)],
                )
            if final_state is not None:
                db.execute(
                    "UPDATE batches SET state = ?, finished = ? WHERE batch_id = ?", (final_state, now, batch_id)
                )

        commit = self._write(write, awaited=awaited, size=len(result.content) + len(result.display), owed=True)
        owner = None
        if not self._shares.is_open(batch_id):  # recorded before this start (resumed): its row says whose
            row_uid = self._db.execute("SELECT uid FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
            owner = None if row_uid is None else int(row_uid[0])
        uid = self._shares.added(batch_id, held, uid=owner)
        if final_state is not None:
            self._shares.ended(batch_id, now)
        if uid is not None:
            self._keep_within_share(uid)
        return commit

    def batch_done(self, batch_id: str, state: BatchState) -> Commit:
        now = time.time()
        self._shares.ended(batch_id, now)

        def write(db: sqlite3.Connection) -> None:
            db.execute("UPDATE batches SET state = ?, finished = ? WHERE batch_id = ?", (state, now, batch_id))

        return self._write(write, owed=True)

    def set_state(self, batch_id: str, state: BatchState) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("UPDATE batches SET state = ? WHERE batch_id = ?", (state, batch_id))

        self._write_now(write)

    # ------------------------------------------------------------------ reads

    def changes(self, batch_id: str) -> list[StoredChange]:
        """What the batch's calls did to each path, in the order they did it."""
        self.flush()
        return [
            _stored_change(row)
            for row in self._db.execute(
                "SELECT idx, path, kind, mode, hash, note, after_kind, after_hash, after_mode, uid, gid, xattrs, "
                "moved_to FROM changes WHERE batch_id = ? ORDER BY seq",
                (batch_id,),
            )
        ]

    async def kept_hashes(self) -> set[str]:
        """Every pre-image the journal still names (the undo store keeps these). Read on a
        thread: at 200,000 changes it takes about 0.13 s, which no client should wait for
        (SQLite's DISTINCT took 0.8-1 s; a Python set does the same job)."""
        self.flush()
        return await trio.to_thread.run_sync(self._read_kept_hashes)

    def _read_kept_hashes(self) -> set[str]:
        with self._reading:
            return {row[0] for row in self._reader_db.execute("SELECT hash FROM changes WHERE hash != ''")}

    def exists(self, batch_id: str, *, flush: bool = True) -> bool:
        if flush:
            self.flush()
        return self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone() is not None

    def load(self, batch_id: str, *, flush: bool = True) -> StoredBatch | None:
        if flush:
            self.flush()
        return journal_rows.stored_batch(self._db, batch_id)

    def summaries(
        self, *, uid: int | None, limit: int = 1000, flush: bool = True
    ) -> list[tuple[str, str, float, int, int]]:
        """(batch_id, state, submitted, calls, uid), newest first; ``uid=None`` for everyone's."""
        if flush:
            self.flush()
        query = (
            "SELECT b.batch_id, b.state, b.submitted, (SELECT COUNT(*) FROM calls c WHERE c.batch_id = "
            "b.batch_id), b.uid FROM batches b"
        )
        params: tuple[Any, ...] = ()
        if uid is not None:
            query += " WHERE b.uid = ?"
            params = (uid,)
        query += " ORDER BY b.submitted DESC LIMIT ?"
        return [tuple(r) for r in self._db.execute(query, (*params, limit))]

    # ------------------------------------------------------------------ MCP servers' connections

    def server_connection(self, server: str, identity: Identity, record: Mapping[str, Any]) -> None:
        """Keep one connection MCP server ``server`` (running as ``identity``) made or was
        refused; nobody waits for the write. Old rows past the server's share are trimmed."""
        row = connection_rows.row(server, identity, record, time.time())
        self._write(Rows([(connection_rows.INSERT, [row])]))
        key = (server, identity.uid)
        added = self._server_rows_since_trim.get(key, 0) + 1
        if added >= min(connection_rows.TRIM_EVERY, self.server_connections_kept):
            self._write(connection_rows.trim(server, identity.uid, self.server_connections_kept))
            added = 0
        self._server_rows_since_trim[key] = added

    def server_connections(
        self, *, uid: int | None, server: str | None, limit: int, flush: bool = True
    ) -> list[ServerConnection]:
        """MCP servers' connections, newest first (``uid``/``server`` None: all of them)."""
        if flush:
            self.flush()
        return connection_rows.newest(self._db, uid=uid, server=server, limit=limit)

    # ------------------------------------------------------------------ recovery and retention

    def recover(self) -> list[str]:
        """After a crash: give started-but-unfinished calls their "interrupted" result, mark
        every unfinished batch ``interrupted`` (or ``finished`` when nothing is pending).
        Returns the ids of every batch waiting for resume/discard, this restart's or older.
        Runs at start-up, before the writer thread."""
        assert self._writer is None
        now = time.time()
        self.interrupted_calls = 0
        unfinished = [
            r[0]
            for r in self._db.execute(
                "SELECT batch_id FROM batches WHERE state IN ('planned', 'awaiting_confirmation', 'running')"
            )
        ]
        self.undos_to_finish = []
        for batch_id in unfinished:
            with self._transaction() as db:
                db.execute("BEGIN IMMEDIATE")
                finish_undo, interrupted = journal_recovery.settle_after_crash(db, batch_id, now)
                db.execute("COMMIT")
            if finish_undo:
                self.undos_to_finish.append(batch_id)
            self.interrupted_calls += interrupted
        return [r[0] for r in self._db.execute("SELECT batch_id FROM batches WHERE state = 'interrupted'")]

    def discard(self, batch_id: str) -> None:
        """Resolve every call without a result as failed "discarded after restart"."""
        now = time.time()

        self._write_now(lambda db: journal_recovery.discard(db, batch_id, now))

    async def prune(self, *, older_than_seconds: float, uid: int | None = None) -> list[str]:
        """Delete finished or cancelled batches that ended before the cutoff (of ``uid``, or
        everyone's), and the MCP servers' connections that did; their ids. In turns of
        ``journal_pruning.PRUNE_CHUNK`` batches per commit on the writer thread, the loop free between them:
        the other writes take their turns and nobody's call waits for the whole prune."""
        cutoff, removed = time.time() - older_than_seconds, []
        while True:
            commit = self._write(journal_pruning.prune_some(cutoff, uid), awaited=True, long=True)
            await commit.durable()
            await trio.lowlevel.checkpoint()  # (without the writer thread, the turns run here)
            some, freed = commit.value
            self._shares.pruned(freed, set(some))
            removed += some
            if len(some) < journal_pruning.PRUNE_CHUNK:
                return removed


def _nothing(db: sqlite3.Connection) -> None:
    """A write that writes nothing: committed after every write queued before it."""


def _stored_change(row: tuple[Any, ...]) -> StoredChange:
    index, path, kind, mode, hash_, note, after_kind, after_hash, after_mode, uid, gid, xattrs, moved_to = row
    attributes = _attributes(xattrs)
    return StoredChange(
        index, path, kind, mode, hash_, note, after_kind, after_hash, after_mode, uid, gid, attributes, moved_to
    )


def _attributes(stored: bytes | None) -> dict[str, bytes]:
    """A change's extended attributes as the journal keeps them (MessagePack; NULL: none)."""
    return msgspec.msgpack.decode(stored, type=dict[str, bytes]) if stored else {}
