"""The journal's tables and how an older journal is brought up to date: one migration per
schema version, applied in order at open, each in its own transaction."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 9

MIGRATIONS: dict[int, str] = {
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
    # Most results show what they say: their display is not stored a second time.
    4: "ALTER TABLE results ADD COLUMN display_is_content INTEGER NOT NULL DEFAULT 0",
    # The connections MCP servers made through the egress proxy: a server's belong to no
    # one call, so they are kept on their own, per server and uid.
    5: """
    CREATE TABLE server_connections (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        server      TEXT NOT NULL,
        uid         INTEGER NOT NULL,
        gid         INTEGER NOT NULL,
        ended       REAL NOT NULL,
        host        TEXT NOT NULL,
        port        INTEGER NOT NULL,
        protocol    TEXT NOT NULL,
        address     TEXT NOT NULL,
        allowed_by  TEXT NOT NULL,
        refused     TEXT NOT NULL,
        sent        INTEGER NOT NULL,
        received    INTEGER NOT NULL
    );
    CREATE INDEX server_connections_by_uid ON server_connections(uid, seq);
    CREATE INDEX server_connections_by_server ON server_connections(uid, server, seq);
    CREATE INDEX server_connections_by_age ON server_connections(ended)
    """,
    # What each batch holds (its calls' arguments, its results, its pre-images), so that
    # a uid's share of the journal is known without reading every row: counted for the
    # batches already there, kept up to date as rows are written.
    6: """
    ALTER TABLE batches ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE batches SET bytes =
        COALESCE((SELECT SUM(length(CAST(arguments AS BLOB))) FROM calls WHERE calls.batch_id = batches.batch_id), 0)
        + COALESCE((SELECT SUM(length(CAST(content AS BLOB)) + length(CAST(display AS BLOB))
                               + COALESCE(length(data), 0) + COALESCE(length(error), 0))
                    FROM results WHERE results.batch_id = batches.batch_id), 0);
    CREATE INDEX batches_by_uid_age ON batches(uid, finished)
    """,
    # A user's batches newest first (``list_batches``, which any user may ask as often as
    # they like) through an index: sorting all of the uid's rows took 62 ms of the loop
    # at 33,000 batches.
    7: "CREATE INDEX batches_by_uid_newest ON batches(uid, submitted)",
    # Each path's permission bits as the batch left it, so that an undo sees a mode
    # changed since (a chmod) as a change, as it sees new contents (-1: not recorded);
    # and the owner, group and extended attributes (ACLs) of a file or directory before,
    # so that an undo which makes it again gives them back (-1 and NULL: not recorded).
    8: """
    ALTER TABLE changes ADD COLUMN after_mode INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE changes ADD COLUMN uid INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE changes ADD COLUMN gid INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE changes ADD COLUMN xattrs BLOB
    """,
    # Where a call moved a path whose contents it did not keep (a tree larger than the
    # undo bound): its undo moves it back from there ("": made again from its contents).
    9: "ALTER TABLE changes ADD COLUMN moved_to TEXT NOT NULL DEFAULT ''",
}


class NewerSchema(Exception):
    """The journal was written by a newer daemon."""

    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def migrate(db: sqlite3.Connection) -> None:
    """Apply the migrations ``db`` lacks; raise ``NewerSchema`` for a journal of a newer schema."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise NewerSchema(version)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        db.executescript(f"BEGIN; {MIGRATIONS[target]}; PRAGMA user_version={target}; COMMIT;")


def intact(db: sqlite3.Connection) -> bool:
    """SQLite's own check of every page (``quick_check``). It reads the whole file: about
    0.2 s for a journal of 500 MB in the page cache, 8.5 s from disk after a reboot. So it
    runs only on a journal a crash left behind (its write-ahead log still there). A
    journal closed cleanly was whole then; a page damaged since fails the read or write
    that meets it, like damage that happens while the daemon runs."""
    return bool(db.execute("PRAGMA quick_check").fetchone()[0] == "ok")
