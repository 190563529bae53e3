"""The journal: batches, their calls in order, and results, in SQLite (WAL mode).

Write discipline, kept by the service and executor:

1. the batch, its calls and any pre-resolved results, in one transaction, before
   ``batch_accepted`` is sent;
2. a side-effecting call's ``started`` mark before the tool runs (a read-only call needs
   none: after a crash it has no result, stays pending, and resume runs it again);
3. a call's result before the next call starts and before the result is sent;
4. the batch's final state (with the last result, in the same transaction).

A call with a ``started`` mark and no result was running when the daemon died: on
the next start it gets an "interrupted" error result and is never run again
Calls that never started wait for ``resume`` or ``discard``.

``synchronous = "normal"`` (default) survives a daemon crash (WAL: a committed
transaction is in the log before the call returns); ``"full"`` also fsyncs each
commit so it survives power loss, at the cost of one fsync per commit.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import msgspec

from toold_protocol import (
    BatchState,
    Disposition,
    Identity,
    PlannedCall,
    RiskLevel,
    ToolCall,
    ToolErrorInfo,
    ToolResult,
)

from .undo.images import Change

SCHEMA_VERSION = 3
JOURNAL_NAME = "journal.sqlite3"
INTERRUPTED = "interrupted: the daemon stopped while this call was running; its side effects may have happened"
DISCARDED = "discarded after restart"

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE batches (
        batch_id    TEXT PRIMARY KEY,
        uid         INTEGER NOT NULL,
        gid         INTEGER NOT NULL,
        pid         INTEGER NOT NULL,
        client_name TEXT NOT NULL,
        turn_id     TEXT,
        submitted   REAL NOT NULL,
        finished    REAL,
        state       TEXT NOT NULL,
        fingerprint TEXT NOT NULL
    );
    CREATE INDEX batches_by_state ON batches(state, submitted);
    CREATE TABLE calls (
        batch_id    TEXT NOT NULL REFERENCES batches(batch_id) ON DELETE CASCADE,
        idx         INTEGER NOT NULL,
        call_id     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        arguments   BLOB NOT NULL,
        disposition TEXT NOT NULL,
        summary     TEXT NOT NULL,
        risk        TEXT NOT NULL,
        started     REAL,
        PRIMARY KEY (batch_id, idx)
    );
    CREATE TABLE results (
        batch_id    TEXT NOT NULL REFERENCES batches(batch_id) ON DELETE CASCADE,
        idx         INTEGER NOT NULL,
        call_id     TEXT NOT NULL,
        ok          INTEGER NOT NULL,
        content     TEXT NOT NULL,
        display     TEXT NOT NULL,
        data        BLOB,
        error       BLOB,
        truncated   INTEGER NOT NULL,
        duration_ms REAL NOT NULL,
        finished    REAL NOT NULL,
        PRIMARY KEY (batch_id, idx)
    );
    """,
    # The session's workspace ("" = the daemon's roots): a recovered batch runs there again.
    2: "ALTER TABLE batches ADD COLUMN workspace TEXT NOT NULL DEFAULT ''",
    # What each mutating call did to each path, for undo (the bytes live in the undo store).
    3: """
    CREATE TABLE changes (
        batch_id    TEXT NOT NULL REFERENCES batches(batch_id) ON DELETE CASCADE,
        seq         INTEGER NOT NULL,
        idx         INTEGER NOT NULL,
        path        TEXT NOT NULL,
        kind        TEXT NOT NULL,
        mode        INTEGER NOT NULL,
        hash        TEXT NOT NULL,
        note        TEXT NOT NULL,
        after_kind  TEXT NOT NULL,
        after_hash  TEXT NOT NULL,
        PRIMARY KEY (batch_id, seq)
    )
    """,
}

_encoder = msgspec.msgpack.Encoder()
_error_decoder = msgspec.msgpack.Decoder(ToolErrorInfo)
_data_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class JournalError(Exception):
    """The journal cannot be used (corrupt, newer schema, unreadable). The message says why."""


@dataclass(frozen=True, slots=True)
class StoredChange:
    index: int
    path: str
    kind: str
    mode: int
    hash: str
    note: str
    after_kind: str
    after_hash: str


@dataclass(frozen=True, slots=True)
class StoredCall:
    index: int
    call_id: str
    tool: str
    arguments: bytes
    disposition: str
    summary: str
    risk: str
    started: float | None

    def planned(self, result: ToolResult | None) -> PlannedCall:
        return PlannedCall(
            index=self.index,
            call_id=self.call_id,
            name=self.tool,
            disposition=cast(Disposition, self.disposition),
            summary=self.summary,
            risk=cast(RiskLevel, self.risk),
            result=result,
        )

    def tool_call(self) -> ToolCall:
        return ToolCall(call_id=self.call_id, name=self.tool, arguments=msgspec.Raw(self.arguments))


@dataclass(frozen=True, slots=True)
class StoredBatch:
    batch_id: str
    identity: Identity
    client_name: str
    turn_id: str | None
    submitted: float
    finished: float | None
    state: BatchState
    fingerprint: str
    calls: list[StoredCall]
    results: list[ToolResult | None]  # by call index
    workspace: str = ""  # the session's workspace, "" for the daemon's roots


def fingerprint(calls: Sequence[ToolCall]) -> str:
    """What makes two submissions "the same batch": call ids, tool names and argument bytes, in order."""
    digest = hashlib.sha256()
    for call in calls:
        digest.update(_encoder.encode([call.call_id, call.name, bytes(call.arguments)]))
    return digest.hexdigest()


class Journal:
    def __init__(self, path: Path, *, synchronous: Literal["normal", "full"] = "normal") -> None:
        self.path = path
        self._lock_fd: int | None = None
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            if self._db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise JournalError(f"{path}: the journal is damaged (quick_check failed); move it aside to start fresh")
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{path}: cannot use the journal: {exc}; move it aside to start fresh") from None
        os.chmod(path, 0o600)

    @classmethod
    def open_in(cls, state_dir: Path, *, synchronous: Literal["normal", "full"] = "normal") -> Journal:
        """Open the journal of ``state_dir``, holding an exclusive lock on the directory: a
        second daemon's recovery would otherwise mark the first one's running batches interrupted."""
        if not state_dir.is_dir():
            raise JournalError(f"state directory {state_dir} does not exist")
        lock = os.open(state_dir / "journal.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            raise JournalError(f"another toold is using the journal in {state_dir}") from None
        try:
            journal = cls(state_dir / JOURNAL_NAME, synchronous=synchronous)
        except BaseException:
            os.close(lock)
            raise
        journal._lock_fd = lock
        return journal

    def close(self) -> None:
        self._db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"{self.path}: the journal has schema version {version}, newer than this daemon's "
                f"{SCHEMA_VERSION}; run a newer toold or move the journal aside"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction():
                self._db.executescript(f"BEGIN; {_MIGRATIONS[target]}; PRAGMA user_version={target}; COMMIT;")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._db
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ writes (in discipline order)

    def record_batch(
        self,
        *,
        batch_id: str,
        identity: Identity,
        client_name: str,
        turn_id: str | None,
        digest: str,
        calls: Sequence[ToolCall],
        planned: Sequence[PlannedCall],
        workspace: str = "",
    ) -> None:
        """Step 1: the batch, its calls and pre-resolved results, atomically."""
        now = time.time()
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, NULL, 'planned', ?, ?)",
                (batch_id, identity.uid, identity.gid, identity.pid, client_name, turn_id, now, digest, workspace),
            )
            db.executemany(
                "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                [
                    (
                        batch_id,
                        plan.index,
                        call.call_id,
                        call.name,
                        bytes(call.arguments),
                        plan.disposition,
                        plan.summary,
                        plan.risk,
                    )
                    for call, plan in zip(calls, planned, strict=True)
                ],
            )
            for plan in planned:
                if plan.result is not None:
                    self._insert_result(batch_id, plan.index, plan.result, now)
            db.execute("COMMIT")

    def started(self, batch_id: str, index: int) -> None:
        """Step 2: from here on, a crash means "may have happened"."""
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE calls SET started = ? WHERE batch_id = ? AND idx = ?", (time.time(), batch_id, index))
            db.execute("UPDATE batches SET state = 'running' WHERE batch_id = ? AND state != 'running'", (batch_id,))
            db.execute("COMMIT")

    def result(
        self,
        batch_id: str,
        index: int,
        result: ToolResult,
        *,
        final_state: BatchState | None = None,
        changes: Sequence[Change] = (),
    ) -> None:
        """Step 3: before the next call starts and before the result is sent. With
        ``final_state`` (the batch's last call), the batch's end is in the same transaction;
        ``changes`` (what the call did to each path, for undo) too."""
        now = time.time()
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            self._insert_result(batch_id, index, result, now)
            if changes:
                first = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM changes WHERE batch_id = ?", (batch_id,))
                start = int(first.fetchone()[0])
                db.executemany(
                    "INSERT INTO changes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            batch_id,
                            start + n,
                            index,
                            c.before.path,
                            c.before.kind,
                            c.before.mode,
                            c.before.hash,
                            c.before.note,
                            c.after_kind,
                            c.after_hash,
                        )
                        for n, c in enumerate(changes)
                    ],
                )
            if final_state is not None:
                db.execute(
                    "UPDATE batches SET state = ?, finished = ? WHERE batch_id = ?", (final_state, now, batch_id)
                )
            db.execute("COMMIT")

    def batch_done(self, batch_id: str, state: BatchState) -> None:
        self._db.execute(
            "UPDATE batches SET state = ?, finished = ? WHERE batch_id = ?", (state, time.time(), batch_id)
        )

    def set_state(self, batch_id: str, state: BatchState) -> None:
        self._db.execute("UPDATE batches SET state = ? WHERE batch_id = ?", (state, batch_id))

    def _insert_result(self, batch_id: str, index: int, result: ToolResult, now: float) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                batch_id,
                index,
                result.call_id,
                int(result.ok),
                result.content,
                result.display,
                None if result.data is None else _encoder.encode(result.data),
                None if result.error is None else _encoder.encode(result.error),
                int(result.truncated),
                result.duration_ms,
                now,
            ),
        )

    # ------------------------------------------------------------------ reads

    def changes(self, batch_id: str) -> list[StoredChange]:
        """What the batch's calls did to each path, in the order they did it."""
        return [
            StoredChange(*row)
            for row in self._db.execute(
                "SELECT idx, path, kind, mode, hash, note, after_kind, after_hash FROM changes "
                "WHERE batch_id = ? ORDER BY seq",
                (batch_id,),
            )
        ]

    def kept_hashes(self) -> set[str]:
        """Every pre-image the journal still names (the undo store keeps these)."""
        return {row[0] for row in self._db.execute("SELECT DISTINCT hash FROM changes WHERE hash != ''")}

    def exists(self, batch_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone() is not None

    def load(self, batch_id: str) -> StoredBatch | None:
        row = self._db.execute(
            "SELECT batch_id, uid, gid, pid, client_name, turn_id, submitted, finished, state, fingerprint, "
            "workspace FROM batches WHERE batch_id = ?",
            (batch_id,),
        ).fetchone()
        if row is None:
            return None
        calls = [
            StoredCall(*r)
            for r in self._db.execute(
                "SELECT idx, call_id, tool, arguments, disposition, summary, risk, started FROM calls "
                "WHERE batch_id = ? ORDER BY idx",
                (batch_id,),
            )
        ]
        results: list[ToolResult | None] = [None] * len(calls)
        for r in self._db.execute(
            "SELECT idx, call_id, ok, content, display, data, error, truncated, duration_ms FROM results "
            "WHERE batch_id = ? ORDER BY idx",
            (batch_id,),
        ):
            results[r[0]] = ToolResult(
                call_id=r[1],
                ok=bool(r[2]),
                content=r[3],
                display=r[4],
                data=None if r[5] is None else _data_decoder.decode(r[5]),
                error=None if r[6] is None else _error_decoder.decode(r[6]),
                truncated=bool(r[7]),
                duration_ms=r[8],
            )
        return StoredBatch(
            row[0],
            Identity(uid=row[1], gid=row[2], pid=row[3]),
            row[4],
            row[5],
            row[6],
            row[7],
            row[8],
            row[9],
            calls,
            results,
            row[10],
        )

    def summaries(self, *, uid: int | None, limit: int = 1000) -> list[tuple[str, str, float, int, int]]:
        """(batch_id, state, submitted, calls, uid), newest first; ``uid=None`` for everyone's."""
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

    # ------------------------------------------------------------------ recovery and retention

    def recover(self) -> list[str]:
        """After a crash: give started-but-unfinished calls their "interrupted" result, mark
        every unfinished batch ``interrupted`` (or ``finished`` when nothing is pending).
        Returns the ids of every batch waiting for resume/discard, this restart's or older."""
        now = time.time()
        unfinished = [
            r[0]
            for r in self._db.execute(
                "SELECT batch_id FROM batches WHERE state IN ('planned', 'awaiting_confirmation', 'running')"
            )
        ]
        for batch_id in unfinished:
            with self._transaction() as db:
                db.execute("BEGIN IMMEDIATE")
                for index, call_id in _without_result(db, batch_id, started_only=True):
                    self._insert_result(batch_id, index, _error_result(call_id, "INTERRUPTED", INTERRUPTED), now)
                state = "interrupted" if _without_result(db, batch_id) else "finished"
                db.execute(
                    "UPDATE batches SET state = ?, finished = CASE WHEN ? = 'finished' THEN ? END WHERE batch_id = ?",
                    (state, state, now, batch_id),
                )
                db.execute("COMMIT")
        return [r[0] for r in self._db.execute("SELECT batch_id FROM batches WHERE state = 'interrupted'")]

    def discard(self, batch_id: str) -> None:
        """Resolve every call without a result as failed "discarded after restart"."""
        now = time.time()
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            for index, call_id in _without_result(db, batch_id):
                self._insert_result(batch_id, index, _error_result(call_id, "DISCARDED", DISCARDED), now)
            db.execute("UPDATE batches SET state = 'cancelled', finished = ? WHERE batch_id = ?", (now, batch_id))
            db.execute("COMMIT")

    def prune(self, *, older_than_seconds: float, uid: int | None = None) -> list[str]:
        """Delete finished or cancelled batches that ended before the cutoff. Returns their ids."""
        cutoff = time.time() - older_than_seconds
        where = "state IN ('finished', 'cancelled') AND finished < ?"
        params: tuple[Any, ...] = (cutoff,)
        if uid is not None:
            where += " AND uid = ?"
            params = (cutoff, uid)
        with self._transaction() as db:
            db.execute("BEGIN IMMEDIATE")
            ids = [r[0] for r in db.execute(f"SELECT batch_id FROM batches WHERE {where}", params)]  # noqa: S608
            db.execute(f"DELETE FROM batches WHERE {where}", params)  # noqa: S608
            db.execute("COMMIT")
        return ids


def _without_result(db: sqlite3.Connection, batch_id: str, *, started_only: bool = False) -> list[tuple[int, str]]:
    """(index, call id) of the batch's calls that have no result yet; only those that
    had started when ``started_only``."""
    return db.execute(
        "SELECT c.idx, c.call_id FROM calls c LEFT JOIN results r ON r.batch_id = c.batch_id AND r.idx = c.idx "
        "WHERE c.batch_id = ? AND r.idx IS NULL AND (? = 0 OR c.started IS NOT NULL) ORDER BY c.idx",
        (batch_id, int(started_only)),
    ).fetchall()


def _error_result(call_id: str, code: str, message: str) -> ToolResult:
    error = ToolErrorInfo(type="Cancelled" if code == "DISCARDED" else "ExecutionFailed", code=code, message=message)
    return ToolResult(
        call_id=call_id,
        ok=False,
        content=f"Error ({error.type}): {message}",
        display=f"Error ({error.type}): {message}",
        error=error,
    )
