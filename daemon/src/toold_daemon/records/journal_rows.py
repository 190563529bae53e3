"""How a batch's calls and results become journal rows, and how a result row reads back:
the statements, the columns and their order, in one place."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from toold_protocol import Identity, PlannedCall, ToolCall, ToolErrorInfo, ToolResult

from .stored_batches import StoredBatch, StoredCall

INSERT_BATCH = "INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_CALL = "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_RESULT = "INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#: What ``stored_result`` reads, in its order.
RESULT_COLUMNS = "call_id, ok, content, display, data, error, truncated, duration_ms, display_is_content"

_encoder = msgspec.msgpack.Encoder()
_error_decoder = msgspec.msgpack.Decoder(ToolErrorInfo)
_data_decoder = msgspec.msgpack.Decoder(dict[str, Any])


def call_columns(batch_id: str, call: ToolCall, plan: PlannedCall) -> tuple[Any, ...]:
    """A call's row but its started time."""
    return (
        batch_id,
        plan.index,
        call.call_id,
        call.name,
        bytes(call.arguments),
        plan.disposition,
        plan.summary,
        plan.risk,
    )


def insert_result(db: sqlite3.Connection, batch_id: str, index: int, result: ToolResult, now: float) -> None:
    db.execute(INSERT_RESULT, result_row(batch_id, index, result, now))


def result_row(batch_id: str, index: int, result: ToolResult, now: float) -> tuple[Any, ...]:
    """A result row; ``display`` is stored only when it differs from ``content`` (most
    results: a read's 4 KB is written once, not twice)."""
    same = result.display == result.content
    return (
        batch_id,
        index,
        result.call_id,
        int(result.ok),
        result.content,
        "" if same else result.display,
        None if result.data is None else _encoder.encode(result.data),
        None if result.error is None else _encoder.encode(result.error),
        int(result.truncated),
        result.duration_ms,
        now,
        int(same),
    )


def result_bytes(row: tuple[Any, ...]) -> int:
    """The bytes a result row carries: its content, display, data and error."""
    return len(row[4]) + len(row[5]) + len(row[6] or b"") + len(row[7] or b"")


def stored_result(row: tuple[Any, ...]) -> ToolResult:
    """A result read back: ``row`` is an index followed by ``RESULT_COLUMNS``."""
    return ToolResult(
        call_id=row[1],
        ok=bool(row[2]),
        content=row[3],
        display=row[3] if row[9] else row[4],
        data=None if row[5] is None else _data_decoder.decode(row[5]),
        error=None if row[6] is None else _error_decoder.decode(row[6]),
        truncated=bool(row[7]),
        duration_ms=row[8],
    )


def stored_batch(db: sqlite3.Connection, batch_id: str) -> StoredBatch | None:
    """The batch as the journal holds it: its row, its calls and their results."""
    row = db.execute(
        "SELECT batch_id, uid, gid, pid, client_name, turn_id, submitted, finished, state, fingerprint, "
        "workspace FROM batches WHERE batch_id = ?",
        (batch_id,),
    ).fetchone()
    if row is None:
        return None
    calls = [
        StoredCall(*r)
        for r in db.execute(
            "SELECT idx, call_id, tool, arguments, disposition, summary, risk, started FROM calls "
            "WHERE batch_id = ? ORDER BY idx",
            (batch_id,),
        )
    ]
    results: list[ToolResult | None] = [None] * len(calls)
    query = f"SELECT idx, {RESULT_COLUMNS} FROM results WHERE batch_id = ? ORDER BY idx"  # noqa: S608
    for r in db.execute(query, (batch_id,)):
        results[r[0]] = stored_result(r)
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
