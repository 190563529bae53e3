"""Memory entries and todo lists: the small state the daemon keeps for each user.

One SQLite file in the state directory (``memory.sqlite3``, WAL). Every row is keyed by
the client's kernel uid and a scope (``user``, or ``workspace:ROOT``), which the tools
take from the session, never from the call: one user never reaches another's rows,
whatever the arguments say. Each call is one ``BEGIN IMMEDIATE`` transaction, so
parallel agents of one user lose nothing. Calls come from the daemon's tool threads;
one connection is shared under a lock (a call is microseconds of work).

What one user holds is bounded across all scopes together, not only per scope: a user
can open any number of workspaces, each a scope of its own, and the file is shared by
every user (a full disk fails everyone's calls). Each uid's memory bytes (keys and
values, as UTF-8) and todo count are kept in ``user_totals``, changed in the same
transaction as the rows, and counted from the rows once when the table is created.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from .state_files import refuse_links

FILE_NAME = "memory.sqlite3"
#: "Always" answers kept per uid over all workspaces (a host each).
MAX_GRANTS_PER_UID = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memory (
    uid INTEGER NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (uid, scope, key)
);
CREATE TABLE IF NOT EXISTS todos (
    uid INTEGER NOT NULL, scope TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, task TEXT NOT NULL,
    status TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (uid, scope, id)
);
CREATE TABLE IF NOT EXISTS grants (
    uid INTEGER NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (uid, scope, key)
);
CREATE TABLE IF NOT EXISTS todo_counters (
    uid INTEGER NOT NULL, scope TEXT NOT NULL, last INTEGER NOT NULL, PRIMARY KEY (uid, scope)
);
"""

#: Version 1 adds each uid's totals, counted from the rows a daemon before it kept.
_TOTALS = """
CREATE TABLE user_totals (
    uid INTEGER PRIMARY KEY, memory_bytes INTEGER NOT NULL DEFAULT 0, todos INTEGER NOT NULL DEFAULT 0
);
INSERT INTO user_totals (uid) SELECT uid FROM memory UNION SELECT uid FROM todos;
UPDATE user_totals SET
    memory_bytes = COALESCE((SELECT SUM(length(CAST(key AS BLOB)) + length(CAST(value AS BLOB)))
                             FROM memory WHERE memory.uid = user_totals.uid), 0),
    todos = (SELECT COUNT(*) FROM todos WHERE todos.uid = user_totals.uid);
PRAGMA user_version = 1;
"""


class Full(Exception):
    """A limit (keys per scope, todos per list) would be exceeded."""


class UnknownTodo(Exception):
    pass


class Todo(msgspec.Struct, frozen=True):
    id: str
    task: str
    status: str
    created: float


class UserState:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        if self._db.execute("PRAGMA user_version").fetchone()[0] < 1:
            self._db.executescript(f"BEGIN IMMEDIATE; {_TOTALS}; COMMIT;")
        self._lock = threading.Lock()

    @classmethod
    def open_in(cls, state_dir: Path) -> UserState:
        path = state_dir / FILE_NAME
        refuse_links(path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")))
        return cls(path)

    def companions(self) -> list[Path]:
        """The files SQLite keeps beside the database (owned with it)."""
        return [self.path, self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")]

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # memory

    def get(self, uid: int, scope: str, key: str) -> str | None:
        with self._transaction() as db:
            row = db.execute("SELECT value FROM memory WHERE uid=? AND scope=? AND key=?", (uid, scope, key)).fetchone()
        return None if row is None else str(row[0])

    def set(self, uid: int, scope: str, key: str, value: str, *, max_keys: int, max_bytes: int) -> bool:
        """Store ``value``; True if the key is new. Raises Full past ``max_keys`` in this
        scope, or past ``max_bytes`` for all of this uid's keys and values together."""
        with self._transaction() as db:
            row = db.execute("SELECT value FROM memory WHERE uid=? AND scope=? AND key=?", (uid, scope, key)).fetchone()
            if row is None:
                (count,) = db.execute("SELECT COUNT(*) FROM memory WHERE uid=? AND scope=?", (uid, scope)).fetchone()
                if count >= max_keys:
                    raise Full(f"this scope already holds {count} keys (max_keys = {max_keys})")
            change = _size(key, value) - (0 if row is None else _size(key, str(row[0])))
            held = _totals(db, uid)[0]
            if change > 0 and held + change > max_bytes:
                raise Full(
                    f"this user's memory holds {held} bytes in all scopes; {change} more would pass "
                    f"max_bytes_per_user = {max_bytes} (delete keys to make room)"
                )
            db.execute(
                "INSERT INTO memory VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (uid, scope, key) DO UPDATE SET value=excluded.value, updated=excluded.updated",
                (uid, scope, key, value, time.time()),
            )
            _add_to_totals(db, uid, memory_bytes=change)
        return row is None

    def delete(self, uid: int, scope: str, key: str) -> bool:
        with self._transaction() as db:
            row = db.execute(
                "DELETE FROM memory WHERE uid=? AND scope=? AND key=? RETURNING value", (uid, scope, key)
            ).fetchone()
            if row is not None:
                _add_to_totals(db, uid, memory_bytes=-_size(key, str(row[0])))
        return row is not None

    def held(self, uid: int) -> tuple[int, int]:
        """What ``uid`` holds in all scopes: memory bytes (keys and values) and todos."""
        with self._transaction() as db:
            return _totals(db, uid)

    def entries(self, uid: int, scope: str) -> list[tuple[str, str]]:
        with self._transaction() as db:
            rows = db.execute("SELECT key, value FROM memory WHERE uid=? AND scope=? ORDER BY key", (uid, scope))
            return [(str(k), str(v)) for k, v in rows.fetchall()]

    # todos

    def todos(self, uid: int, scope: str) -> list[Todo]:
        with self._transaction() as db:
            return self._todos(db, uid, scope)

    def add_todo(
        self, uid: int, scope: str, task: str, *, max_todos: int, max_per_user: int, status: str = "pending"
    ) -> Todo:
        with self._transaction() as db:
            return self._add(db, uid, scope, task, status=status, max_todos=max_todos, max_per_user=max_per_user)

    def set_status(self, uid: int, scope: str, todo_id: str, status: str) -> Todo:
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE todos SET status=? WHERE uid=? AND scope=? AND id=?", (status, uid, scope, todo_id)
            )
            if cursor.rowcount == 0:
                raise UnknownTodo(todo_id)
            return next(t for t in self._todos(db, uid, scope) if t.id == todo_id)

    def remove_todo(self, uid: int, scope: str, todo_id: str) -> None:
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM todos WHERE uid=? AND scope=? AND id=?", (uid, scope, todo_id))
            if cursor.rowcount == 0:
                raise UnknownTodo(todo_id)
            _add_to_totals(db, uid, todos=-1)

    def replace_todos(
        self, uid: int, scope: str, items: list[tuple[str, str]], *, max_todos: int, max_per_user: int
    ) -> list[Todo]:
        """The whole list at once (the shape models are trained on): new ids, in order."""
        if len(items) > max_todos:
            raise Full(f"{len(items)} todos is more than max_todos = {max_todos}")
        with self._transaction() as db:
            removed = db.execute("DELETE FROM todos WHERE uid=? AND scope=?", (uid, scope)).rowcount
            _add_to_totals(db, uid, todos=-removed)
            for task, status in items:
                self._add(db, uid, scope, task, status=status, max_todos=max_todos, max_per_user=max_per_user)
            return self._todos(db, uid, scope)

    def _add(
        self, db: sqlite3.Connection, uid: int, scope: str, task: str, *, status: str, max_todos: int, max_per_user: int
    ) -> Todo:
        (count,) = db.execute("SELECT COUNT(*) FROM todos WHERE uid=? AND scope=?", (uid, scope)).fetchone()
        if count >= max_todos:
            raise Full(f"the list already holds {count} todos (max_todos = {max_todos})")
        everywhere = _totals(db, uid)[1]
        if everywhere >= max_per_user:
            raise Full(
                f"this user's lists hold {everywhere} todos in all workspaces (max_todos_per_user = {max_per_user})"
            )
        db.execute(
            "INSERT INTO todo_counters VALUES (?, ?, 1) ON CONFLICT (uid, scope) DO UPDATE SET last = last + 1",
            (uid, scope),
        )
        (seq,) = db.execute("SELECT last FROM todo_counters WHERE uid=? AND scope=?", (uid, scope)).fetchone()
        todo = Todo(id=str(seq), task=task, status=status, created=time.time())
        db.execute(
            "INSERT INTO todos VALUES (?, ?, ?, ?, ?, ?, ?)",
            (uid, scope, todo.id, seq, todo.task, todo.status, todo.created),
        )
        _add_to_totals(db, uid, todos=1)
        return todo

    @staticmethod
    def _todos(db: sqlite3.Connection, uid: int, scope: str) -> list[Todo]:
        rows = db.execute(
            "SELECT id, task, status, created FROM todos WHERE uid=? AND scope=? ORDER BY seq", (uid, scope)
        )
        return [Todo(str(i), str(t), str(s), float(c)) for i, t, s, c in rows.fetchall()]

    def grant(self, uid: int, scope: str, key: str) -> bool:
        """Remember a person's "always" answer (a network host for a workspace); False when
        it is not kept: the uid already has ``MAX_GRANTS_PER_UID`` (one user's own answers
        must not grow the shared file without bound)."""
        with self._transaction() as db:
            (count,) = db.execute("SELECT COUNT(*) FROM grants WHERE uid = ?", (uid,)).fetchone()
            if count >= MAX_GRANTS_PER_UID:
                known = db.execute("SELECT 1 FROM grants WHERE uid = ? AND scope = ? AND key = ?", (uid, scope, key))
                return known.fetchone() is not None
            db.execute("INSERT OR IGNORE INTO grants VALUES (?, ?, ?, ?)", (uid, scope, key, time.time()))
        return True

    def granted(self, uid: int, scope: str, key: str) -> bool:
        with self._transaction() as db:
            row = db.execute("SELECT 1 FROM grants WHERE uid = ? AND scope = ? AND key = ?", (uid, scope, key))
            return row.fetchone() is not None

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _size(key: str, value: str) -> int:
    """What a memory entry holds, in bytes as SQLite stores the text (UTF-8)."""
    return len(key.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass"))


def _totals(db: sqlite3.Connection, uid: int) -> tuple[int, int]:
    row = db.execute("SELECT memory_bytes, todos FROM user_totals WHERE uid=?", (uid,)).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def _add_to_totals(db: sqlite3.Connection, uid: int, *, memory_bytes: int = 0, todos: int = 0) -> None:
    db.execute(
        "INSERT INTO user_totals VALUES (?, ?, ?) ON CONFLICT (uid) DO UPDATE SET "
        "memory_bytes = memory_bytes + excluded.memory_bytes, todos = todos + excluded.todos",
        (uid, memory_bytes, todos),
    )
