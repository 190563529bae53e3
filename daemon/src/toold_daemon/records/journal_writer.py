"""The journal's writes, on a thread of their own, several per transaction (group commit).

A commit costs tens of microseconds of SQLite work, and now and then a WAL checkpoint
with its fsyncs (milliseconds): done on the event loop, that is time every client waits.
Here the loop only queues each write (``submit``) and goes on; one thread takes whatever
is queued, runs it in one transaction (each write in its own savepoint, so one failing
write fails alone) and commits. SQLite's automatic checkpoints then run on this thread
too. Under load, many calls' writes share one commit.

A write that must be durable before the daemon acts on it (a side-effecting call's
``started`` mark, its result) is awaited with ``Commit.durable()``. Unless the thread is
in the middle of a commit, such a write is committed at once on the caller's thread,
together with the writes queued before it, which keeps their order (a command's record
writes seven pages to the write-ahead log and costs about 80 µs; handing it to the
thread and back adds two wake-ups, about 110 µs on an idle daemon, and tens of milliseconds on
a busy one, where each hand-over waits for the GIL). Otherwise it is
queued, wakes the thread at once, and the thread wakes the loop once per transaction
that holds such a write. Checkpoints are
never automatic: the thread runs them every ``CHECKPOINT_EVERY`` commits, so their
fsyncs never land on the loop. It runs them on a connection of their own while commits go
on (``_checkpoint_beside_commits``), holding commits off only for what they added
meanwhile: on the writers' connection, a checkpoint (2.7-4.5 ms here, most of it copying
a thousand pages) held up every commit that came during it, so one side-effecting call
in a hundred waited that long for its result.
Nobody waits for the others (a read-only batch's): they wake nobody and are committed
with the next awaited write or within ``LINGER_SECONDS``, so a stream of reads costs a
commit every few milliseconds rather than two per read. Reads on the loop call
``flush()`` first, so they always see every write queued before them.

Who commits such a group once it is due depends on the loop (``commit_due_forever``,
a task of the loop's). While the loop serves one call at a time, the thread commits it
on the other core, beside the loop. While the loop serves several clients at once it has
no core to spare, and it commits a small group itself: handed to the thread, the group's
commit would wait for the GIL at each step, and the thread woke each time the loop let
the GIL go, about once per read. A large group (a flood of big results) stays the
thread's, so the loop never stalls on one commit.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

Write = Callable[[sqlite3.Connection], Any]


class Rows:
    """A write made only of inserts (statement, rows), in order. Consecutive ``Rows``
    writes with the same statements are merged: one ``executemany`` per statement for
    the lot, which is most of what a stream of read-only batches costs."""

    __slots__ = ("statements",)

    def __init__(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        self.statements = statements

    def shape(self) -> tuple[str, ...]:
        return tuple(sql for sql, _ in self.statements)


#: The longest a write nobody waits for stays queued (what a crash may lose of them).
LINGER_SECONDS = 0.01

#: The most a group committed on the loop may carry (bytes of results, as submitted);
#: a larger one is committed by the thread.
LOOP_COMMIT_BYTES = 256 * 1024

#: Commits between two WAL checkpoints (run by the thread; SQLite's own are turned off),
#: or fewer once they carried this many bytes: the write-ahead log is the journal's
#: disk too, and a flood of large writes must not grow it between two checkpoints.
CHECKPOINT_EVERY = 200
CHECKPOINT_BYTES = 64 * 1024 * 1024

#: A write that records what already happened (a call's result and what it changed, a
#: batch's end) and could not be committed (a full disk) is kept and tried again, alone,
#: first after a second, then twice as long each time up to half a minute, until it is
#: committed: the journal then says what the daemon said, and undo knows what the call
#: changed. At most this many writes, and bytes, are kept so; past that the oldest are
#: given up (and said to be).
OWED_RETRY_SECONDS = 1.0
OWED_RETRY_MAX_SECONDS = 30.0
OWED_MAX_WRITES = 10_000
OWED_MAX_BYTES = 64 * 1024 * 1024


class Commit:
    """One queued write. ``settled`` and the event are touched only on the loop thread."""

    __slots__ = ("_event", "awaited", "error", "owed", "owner", "settled", "size", "value")

    def __init__(self, *, awaited: bool = False, owner: int | None = None, size: int = 0, owed: bool = False) -> None:
        self.awaited = awaited  # the loop will wait for it: wake the loop when it is committed
        self.owed = owed  # it records what happened: kept and tried again if it fails (OWED_*)
        self.owner = owner  # the uid whose batch it records (``backlog_of``), if any
        self.size = size
        self.value: Any = None
        self.error: BaseException | None = None
        self.settled = False
        self._event: trio.Event | None = None

    @classmethod
    def done(cls, value: Any = None) -> Commit:
        commit = cls()
        commit.value, commit.settled = value, True
        return commit

    async def durable(self) -> None:
        """Return once the write is committed; raise ``JournalWriteFailed`` if it was not.
        Only for a commit queued with ``awaited=True`` (the others never wake the loop)."""
        assert self.awaited or self.settled, "durable() of a write nobody said it would wait for"
        if not self.settled:
            self._event = trio.Event()
            await self._event.wait()
        if self.error is not None:
            raise JournalWriteFailed(str(self.error)) from self.error

    def settle(self) -> None:
        self.settled = True
        if self._event is not None:
            self._event.set()


class JournalWriteFailed(Exception):
    """A journal write could not be committed (disk full, I/O error, a damaged file)."""


class JournalWriter:
    def __init__(self, db: sqlite3.Connection, token: trio.lowlevel.TrioToken, checkpoints: sqlite3.Connection) -> None:
        """``db``: the writes' connection; ``checkpoints``: another one, the checkpoints'."""
        self._db = db
        self._checkpoints = checkpoints
        for connection in (db, checkpoints):
            connection.execute("PRAGMA wal_autocheckpoint=0")
            connection.execute(f"PRAGMA journal_size_limit={CHECKPOINT_BYTES}")  # the log is cut back after one
        self._commits = 0  # since the last checkpoint
        self._uncheckpointed = 0  # bytes the commits since the last checkpoint carried
        self._token = token
        self._queue: list[tuple[Write | Rows, Commit]] = []
        self._owed: list[tuple[Write | Rows, Commit]] = []  # failed writes to try again (OWED_*)
        self._owed_bytes = 0
        self._owed_due = 0.0  # time.monotonic() of the next try
        self._owed_delay = OWED_RETRY_SECONDS
        self.owed_given_up = 0
        self._queued_bytes = 0  # what the queued writes carry, as their submitters said
        self._queued_by_owner: dict[int, list[int]] = {}  # uid -> [writes, bytes] queued
        self._busy = False
        self._urgent = False  # something queued is waited for: commit now
        self._closing = False
        self._changed = threading.Condition()
        #: Set by ``commit_due_forever`` while it runs: a group of writes nobody waits for
        #: that starts while the loop is crowded is then the loop's to commit when due.
        self._group_started: trio.Event | None = None
        self._crowded: Callable[[], bool] = lambda: False
        self._loop_thread = threading.get_ident()  # made on the loop's thread, inside trio
        self._thread = threading.Thread(target=self._work, name="toold-journal", daemon=True)
        self._thread.start()

    def submit(
        self,
        write: Write | Rows,
        *,
        awaited: bool = False,
        size: int = 0,
        long: bool = False,
        owner: int | None = None,
        owed: bool = False,
    ) -> Commit:
        """Queue ``write``; ``size``: about how many bytes of results it carries; ``long``:
        milliseconds of work (a prune's turn), always the thread's even when it is idle;
        ``owner``: the uid it is counted against while queued (``backlog_of``); ``owed``:
        it records what happened, and is tried again until committed should it fail (its
        commit still reports that first failure)."""
        if awaited and not long:
            done = self._now_if_idle(write, size, owed)
            if done is not None:
                return done
        commit = Commit(awaited=awaited, owner=owner, size=size, owed=owed)
        with self._changed:
            if self._closing:
                raise JournalWriteFailed("the journal is closed")
            first = not self._queue
            self._queue.append((write, commit))
            self._queued_bytes += size
            if owner is not None:
                self._count_owner(owner, 1, size)
            if awaited:
                self._urgent = True
            # The first of a group starts the linger: the thread's, unless the loop keeps it.
            loop_keeps = first and not awaited and self._loop_keeps_groups()
            if awaited or (first and not loop_keeps):
                self._changed.notify_all()
        if loop_keeps:
            assert self._group_started is not None
            self._group_started.set()
        return commit

    def _loop_keeps_groups(self) -> bool:
        return self._group_started is not None and threading.get_ident() == self._loop_thread and self._crowded()

    async def commit_due_forever(self, crowded: Callable[[], bool]) -> None:
        """Commit each group of writes nobody waits for that started while ``crowded()``
        (the loop serves several calls at once) ``LINGER_SECONDS`` after its first write,
        here when it is small, else on the thread. Other groups keep the thread's linger."""
        self._crowded = crowded
        self._group_started = trio.Event()
        try:
            while True:
                await self._group_started.wait()
                self._group_started = trio.Event()
                await trio.sleep(LINGER_SECONDS)
                self._commit_due()
        finally:
            self._group_started = None
            with self._changed:
                if self._queue:  # the thread's linger again, for what is left
                    self._changed.notify_all()

    def _commit_due(self) -> None:
        if self._queued_bytes <= LOOP_COMMIT_BYTES and self._commit_here(None):
            return
        with self._changed:
            if self._queue:
                self._urgent = True
                self._changed.notify_all()

    def _now_if_idle(self, write: Write | Rows, size: int = 0, owed: bool = False) -> Commit | None:
        """Commit ``write`` here and now, with whatever is queued before it (so it keeps
        its place in order), unless the thread is committing: None then (it is queued).

        Under load the thread lingers over a queue of reads most of the time; handing it
        an awaited write means waking it and being woken back, each a wait for the GIL
        (a switch interval while the loop is busy), several times per side-effecting call.
        Committing the queue here costs the loop the same SQLite work the thread would do."""
        commit = Commit(size=size, owed=owed)
        if not self._commit_here((write, commit), size):
            return None
        commit.settled = True
        return commit

    def _commit_here(self, last: tuple[Write | Rows, Commit] | None, size: int = 0) -> bool:
        """Commit what is queued, then ``last`` (``size``: the bytes it carries), on the
        calling thread (the loop's); False, and nothing done, while the thread commits
        or the writer closes."""
        with self._changed:
            if self._busy or self._closing:
                return False
            if not self._queue and last is None:
                return True
            self._busy = True
            group, self._queue = self._queue, []
            self._uncheckpointed += self._queued_bytes + size
            self._queued_bytes = 0
            self._taken(group)
        writes = [*group, last] if last is not None else group
        try:
            if len(writes) == 1:
                self._commit_one(*writes[0])
            else:
                self._commit(writes)
        finally:
            with self._changed:
                self._keep_owed(writes)
                self._busy = False
                self._commits += 1
                if self._checkpoint_due():  # else the thread sleeps on: waking it costs the GIL
                    self._changed.notify_all()
        awaited = [queued for _, queued in group if queued.awaited]
        if awaited:  # queued before and waited for: their waiters are woken as the thread would
            self._wake(awaited)
        return True

    def _commit_one(self, write: Write | Rows, commit: Commit) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            if isinstance(write, Rows):
                for sql, rows in write.statements:
                    db.executemany(sql, rows)
            else:
                commit.value = write(db)
            db.execute("COMMIT")
        except Exception as exc:  # SQLite's, or a value it cannot take (OverflowError): this write fails
            log.error("journal write failed: %s", exc)
            commit.error = exc
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")

    def run_now(self, write: Write | Rows) -> Any:
        """Queue ``write``, wait (blocking) until it is committed, return its value. For
        rare requests (prune, discard, resume), which may block the loop for one commit."""
        commit = self.submit(write)
        self.flush()
        if commit.error is not None:
            raise JournalWriteFailed(str(commit.error)) from commit.error
        return commit.value

    def backlog(self) -> int:
        return len(self._queue)  # read without the lock: a hint, not a count to act on exactly

    def backlog_bytes(self) -> int:
        return self._queued_bytes  # a hint too

    def backlog_of(self, owner: int) -> tuple[int, int]:
        """Writes, and their bytes, queued for ``owner`` and not yet taken (a hint)."""
        counts = self._queued_by_owner.get(owner)
        return (counts[0], counts[1]) if counts is not None else (0, 0)

    def _count_owner(self, owner: int, writes: int, size: int) -> None:
        counts = self._queued_by_owner.setdefault(owner, [0, 0])
        counts[0] += writes
        counts[1] += size
        if counts[0] <= 0:
            del self._queued_by_owner[owner]

    def _taken(self, group: list[tuple[Write | Rows, Commit]]) -> None:
        """``group`` leaves the queue for a commit: its owners' counts go down (lock held)."""
        for _, commit in group:
            if commit.owner is not None:
                self._count_owner(commit.owner, -1, -commit.size)

    def flush(self) -> None:
        """Block until every write queued so far is committed (or failed)."""
        with self._changed:
            if self._queue:
                self._urgent = True
                self._changed.notify_all()
            while self._queue or self._busy:
                self._changed.wait()

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()

    def _work(self) -> None:
        while True:
            self._pay_owed()
            with self._changed:
                while not self._queue and not self._closing and not self._checkpoint_due() and not self._owed_now():
                    self._changed.wait(self._owed_wait())
                if not self._queue and not self._closing and not self._checkpoint_due():
                    continue  # only owed writes are due: tried first thing, alone
                if self._queue and not self._urgent and not self._closing:  # let writes nobody waits for gather
                    self._changed.wait_for(lambda: self._urgent or self._closing, LINGER_SECONDS)
                if self._busy:  # the loop is committing one write itself
                    self._changed.wait_for(lambda: not self._busy)
                if not self._queue and not self._checkpoint_due():
                    if self._closing:
                        self._pay_owed(last=True)
                        return
                    continue
                group, self._queue = self._queue, []
                self._uncheckpointed += self._queued_bytes
                self._queued_bytes = 0
                self._taken(group)
                self._busy, self._urgent = bool(group), False
            if group:
                try:
                    self._commit(group)
                finally:
                    with self._changed:
                        self._keep_owed(group)
                        self._busy = False
                        self._commits += 1
                        self._changed.notify_all()
                awaited = [commit for _, commit in group if commit.awaited]
                if awaited:  # nobody waits on the others: the loop is not woken for them
                    self._wake(awaited)
            with self._changed:
                checkpoint = self._checkpoint_due() or self._closing
            if checkpoint:
                self._checkpoint_beside_commits()

    def _keep_owed(self, written: list[tuple[Write | Rows, Commit]], *, retried: bool = False) -> None:
        """Of ``written``, keep each owed write that failed, to try again (lock held);
        ``retried``: they were owed already, and failed again (the next try waits longer)."""
        for write, commit in written:
            # Only what may pass later (a full disk, an I/O error), not a write SQLite refuses as such.
            if commit.owed and isinstance(commit.error, sqlite3.OperationalError):
                if not self._owed:
                    longer = min(2 * self._owed_delay, OWED_RETRY_MAX_SECONDS)
                    self._owed_delay = longer if retried else OWED_RETRY_SECONDS
                    self._owed_due = time.monotonic() + self._owed_delay
                self._owed.append((write, commit))
                self._owed_bytes += commit.size
        while len(self._owed) > OWED_MAX_WRITES or self._owed_bytes > OWED_MAX_BYTES:
            _, dropped = self._owed.pop(0)
            self._owed_bytes -= dropped.size
            self.owed_given_up += 1
            log.error("journal: gave up a write it could not record (%s); more are waiting", dropped.error)

    def _owed_now(self) -> bool:
        """Owed writes are due, and nobody is committing (else ``_pay_owed`` waits)."""
        return bool(self._owed) and not self._busy and time.monotonic() >= self._owed_due

    def _owed_wait(self) -> float | None:
        """How long the thread may sleep before owed writes are due (None: none owed)."""
        return max(0.005, self._owed_due - time.monotonic()) if self._owed else None

    def _pay_owed(self, *, last: bool = False) -> None:
        """Try the owed writes again, in their order, in a transaction of their own (when
        due; ``last``: now, the writer closing). Those that fail again stay owed."""
        if not self._owed:  # the common case, without the lock
            return
        with self._changed:
            if not self._owed or not (last or self._owed_now()) or self._busy:
                return
            owed = [(write, Commit(size=commit.size, owed=True)) for write, commit in self._owed]
            self._owed, self._owed_bytes, self._busy = [], 0, True
        try:
            self._commit(owed)
        finally:
            with self._changed:
                self._keep_owed(owed, retried=True)
                self._busy = False
                self._changed.notify_all()
        paid = sum(1 for _, commit in owed if commit.error is None)
        if paid:
            log.warning("journal: recorded %d write(s) it could not before", paid)
        if last and self._owed:
            log.error("journal: stopping with %d write(s) it could not record", len(self._owed))

    def _checkpoint_due(self) -> bool:
        return self._commits >= CHECKPOINT_EVERY or self._uncheckpointed >= CHECKPOINT_BYTES

    def _checkpoint_beside_commits(self) -> None:
        """Copy the log into the database while commits go on (the bulk), then, commits
        held off, what they added meanwhile (a few pages: 0.3 ms for three commits' here
        against 2.7-4.5 ms for two hundred): the log is then wholly in the database, and the
        next write starts it over, cut back to ``journal_size_limit``. A checkpoint that
        never caught up would let the log grow without bound under a steady stream of
        writes, each appending to it."""
        self._checkpoint()
        with self._changed:
            self._changed.wait_for(lambda: not self._busy)
            self._busy = True
        try:
            self._checkpoint()
        finally:
            with self._changed:
                self._busy = False
                self._commits = self._uncheckpointed = 0
                self._changed.notify_all()

    def _checkpoint(self) -> None:
        try:
            self._checkpoints.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.warning("journal checkpoint failed (retried later): %s", exc)

    def _commit(self, group: list[tuple[Write | Rows, Commit]]) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for run in _runs(group):
                if len(run) > 1 and not _merged(db, run):
                    for one in run:  # one of them fails: find it, keep the others
                        _alone(db, *one)
                elif len(run) == 1:
                    _alone(db, *run[0])
            db.execute("COMMIT")
        except sqlite3.Error as exc:  # the whole transaction is lost
            log.error("journal commit failed: %s", exc)
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            for _, commit in group:
                commit.error = commit.error or exc

    def _wake(self, commits: list[Commit]) -> None:
        def settle() -> None:
            for commit in commits:
                commit.settle()

        try:
            self._token.run_sync_soon(settle)
        except trio.RunFinishedError:
            for commit in commits:
                commit.settled = True


def _runs(group: list[tuple[Write | Rows, Commit]]) -> list[list[tuple[Write | Rows, Commit]]]:
    """The group in order, consecutive ``Rows`` of one shape together."""
    runs: list[list[tuple[Write | Rows, Commit]]] = []
    for write, commit in group:
        last = runs[-1][-1][0] if runs else None
        if isinstance(write, Rows) and isinstance(last, Rows) and last.shape() == write.shape():
            runs[-1].append((write, commit))
        else:
            runs.append([(write, commit)])
    return runs


def _merged(db: sqlite3.Connection, run: list[tuple[Write | Rows, Commit]]) -> bool:
    """Insert a run of same-shaped ``Rows`` with one ``executemany`` per statement."""
    first = run[0][0]
    assert isinstance(first, Rows)
    db.execute("SAVEPOINT many")
    try:
        for position, (sql, _) in enumerate(first.statements):
            rows = [row for write, _ in run for row in write.statements[position][1]]  # type: ignore[union-attr]
            db.executemany(sql, rows)
    except Exception:  # one of them fails (SQLite, or a value it cannot take): each alone finds which
        db.execute("ROLLBACK TO many")
        db.execute("RELEASE many")
        return False
    db.execute("RELEASE many")
    return True


def _alone(db: sqlite3.Connection, write: Write | Rows, commit: Commit) -> None:
    """One write in its own savepoint: if it fails, it fails alone."""
    db.execute("SAVEPOINT one")
    try:
        if isinstance(write, Rows):
            for sql, rows in write.statements:
                db.executemany(sql, rows)
        else:
            commit.value = write(db)
    except Exception as exc:  # SQLite's, or a value it cannot take: fails alone, never the thread or the loop
        db.execute("ROLLBACK TO one")
        commit.error = exc
        log.error("journal write failed: %s", exc)
    db.execute("RELEASE one")
