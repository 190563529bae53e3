"""Which batches a prune deletes, a turn at a time (``Journal.prune`` takes the turns)."""

from __future__ import annotations

import sqlite3
from typing import Any

from . import server_connections as connection_rows
from .journal_writer import Write

#: Batches deleted per commit. In one transaction, 100,000 batches (500 MB) took 2.5 s of
#: the writer thread, and the event loop waited for it: every client's calls stalled.
#: 500 are about 12 ms.
PRUNE_CHUNK = 500


def prune_some(cutoff: float, uid: int | None) -> Write:
    """A write deleting up to ``PRUNE_CHUNK`` of the finished or cancelled batches that
    ended before ``cutoff`` (of ``uid``, or everyone's), and once none are left, the MCP
    servers' connections that did. Its value: the batches' ids, and the bytes freed per uid."""
    where = "state IN ('finished', 'cancelled') AND finished < ?"
    params: tuple[Any, ...] = (cutoff,)
    if uid is not None:
        where += " AND uid = ?"  # through batches_by_uid_age: a user's prune never scans others'
        params = (cutoff, uid)

    def write(db: sqlite3.Connection) -> tuple[list[str], list[tuple[int, int]]]:
        rows = db.execute(
            f"SELECT batch_id, uid, bytes FROM batches WHERE {where} LIMIT {PRUNE_CHUNK}",  # noqa: S608
            params,
        ).fetchall()
        db.executemany("DELETE FROM batches WHERE batch_id = ?", [(row[0],) for row in rows])
        if len(rows) < PRUNE_CHUNK:
            connection_rows.prune(db, cutoff=cutoff, uid=uid)
        freed: dict[int, int] = {}
        for _, owner, size in rows:
            freed[owner] = freed.get(owner, 0) + size
        return [row[0] for row in rows], list(freed.items())

    return write
