"""The journal's record of the connections MCP servers make through the egress proxy.

A command's connections are part of its result. A server's belong to no one call (it
lives across many, and may connect between them), so each is kept as a row of its
own, under the server's name and the uid it runs as, when it ends or is refused.

A server is untrusted code and may connect in a loop: only the newest rows of each
server and uid are kept (``[journal] server_connections_kept``, by default
``KEPT_PER_SERVER``), trimmed every ``TRIM_EVERY`` rows it adds (or every ``kept``,
if fewer): a server never has more than twice its share.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from toold_protocol import Identity, ServerConnection

from .journal_writer import Write

KEPT_PER_SERVER = 10_000
TRIM_EVERY = 500

INSERT = (
    "INSERT INTO server_connections (server, uid, gid, ended, host, port, protocol, address, allowed_by, "
    "refused, sent, received) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def row(server: str, identity: Identity, record: Mapping[str, Any], ended: float) -> tuple[Any, ...]:
    """The row for ``record`` (as a command's result lists a connection)."""
    return (
        server,
        identity.uid,
        identity.gid,
        ended,
        str(record.get("host", "")),
        int(record.get("port", 0)),
        str(record.get("protocol", "")),
        str(record.get("address", "")),
        str(record.get("allowed_by", "")),
        str(record.get("refused", "")),
        int(record.get("sent", 0)),
        int(record.get("received", 0)),
    )


def trim(server: str, uid: int, kept: int) -> Write:
    """A write that drops all but the newest ``kept`` rows of ``server`` and ``uid``."""

    def write(db: sqlite3.Connection) -> None:
        db.execute(
            "DELETE FROM server_connections WHERE uid = ? AND server = ? AND seq <= (SELECT seq FROM "
            "server_connections WHERE uid = ? AND server = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (uid, server, uid, server, kept),
        )

    return write


def newest(db: sqlite3.Connection, *, uid: int | None, server: str | None, limit: int) -> list[ServerConnection]:
    """The newest ``limit`` rows, newest first; ``uid=None`` for everyone's, ``server=None``
    for every server's. A uid's rows are read through an index (any user may ask, often:
    ``toolctl watch`` does), never by scanning everyone's."""
    conditions = [(column, value) for column, value in (("uid", uid), ("server", server)) if value is not None]
    where = " AND ".join(f"{column} = ?" for column, _ in conditions)
    query = _SELECT + (f" WHERE {where}" if where else "") + " ORDER BY seq DESC LIMIT ?"
    rows = db.execute(query, (*(value for _, value in conditions), limit))
    return [ServerConnection(**dict(zip(_COLUMNS, r, strict=True))) for r in rows]


#: What a listing reads: the fields of the protocol's ``ServerConnection``, by name.
_COLUMNS = tuple(ServerConnection.__struct_fields__)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM server_connections"  # noqa: S608 (fixed names)


def prune(db: sqlite3.Connection, *, cutoff: float, uid: int | None) -> int:
    """Delete the rows that ended before ``cutoff`` (of ``uid``, or everyone's). Returns how many."""
    if uid is None:
        return db.execute("DELETE FROM server_connections WHERE ended < ?", (cutoff,)).rowcount
    return db.execute("DELETE FROM server_connections WHERE ended < ? AND uid = ?", (cutoff, uid)).rowcount
