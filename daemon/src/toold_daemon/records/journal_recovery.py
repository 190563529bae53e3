"""What a restart does with batches a crash left unfinished, in the journal's tables:
a call that had started gets an "interrupted" result (it may have had effects, so it is
never run again unasked), and a batch a person chooses to drop gets "discarded"."""

from __future__ import annotations

import sqlite3

from toold_protocol import ToolErrorInfo, ToolResult

from . import journal_rows

INTERRUPTED = "interrupted: the daemon stopped while this call was running; its side effects may have happened"
DISCARDED = "discarded after restart"


def settle_after_crash(db: sqlite3.Connection, batch_id: str, now: float) -> tuple[bool, int]:
    """One unfinished batch, inside the caller's transaction: its started calls without a
    result are interrupted, and it becomes ``interrupted`` (calls left to run) or
    ``finished``. An undo that had started is finished instead of given up: its call is
    made to run again, resuming. Returns (an undo to finish, calls interrupted)."""
    finish_undo = _is_undo(db, batch_id) and bool(_without_result(db, batch_id, started_only=True))
    if finish_undo:  # (one still waiting for approval waits as any batch)
        db.execute("UPDATE calls SET started = NULL WHERE batch_id = ?", (batch_id,))
    interrupted = 0
    for index, call_id in _without_result(db, batch_id, started_only=True):
        journal_rows.insert_result(db, batch_id, index, _error_result(call_id, "INTERRUPTED", INTERRUPTED), now)
        interrupted += 1
    state = "interrupted" if _without_result(db, batch_id) else "finished"
    db.execute(
        "UPDATE batches SET state = ?, finished = CASE WHEN ? = 'finished' THEN ? END WHERE batch_id = ?",
        (state, state, now, batch_id),
    )
    return finish_undo, interrupted


def discard(db: sqlite3.Connection, batch_id: str, now: float) -> None:
    """Every call of the batch without a result fails as "discarded after restart"."""
    for index, call_id in _without_result(db, batch_id):
        journal_rows.insert_result(db, batch_id, index, _error_result(call_id, "DISCARDED", DISCARDED), now)
    db.execute("UPDATE batches SET state = 'cancelled', finished = ? WHERE batch_id = ?", (now, batch_id))


def _is_undo(db: sqlite3.Connection, batch_id: str) -> bool:
    """Whether the batch is an undo (its calls are ``restore_files`` and nothing else)."""
    tools = {row[0] for row in db.execute("SELECT tool FROM calls WHERE batch_id = ?", (batch_id,))}
    return tools == {"restore_files"}


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
