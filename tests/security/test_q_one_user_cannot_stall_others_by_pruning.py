"""Q. One user cannot stall everyone's calls by pruning their own history. Any user may
prune their finished batches (``toolctl journal prune``). That delete ran in one
transaction while the event loop waited for it: 60,000 small batches took about a second
here (a 500 MB history 2.5 s), and every other client's calls waited that long, as often
as the user cared to fill and prune again. The same wait came with the hourly retention,
and before the first pong after a long stop. Pruning now deletes a few hundred batches
per commit on the journal's thread and the loop serves others between them."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import reachable_daemon
from tests.e2e.test_identity import OTHER_GID, OTHER_UID, as_other_user
from toold_client import Client
from toold_daemon.records.journal import Journal

BATCHES = 60_000


def fill_history(state: Path, uid: int, gid: int, batches: int) -> None:
    """``batches`` finished one-read batches of ``uid``, an hour old, in a fresh journal."""
    Journal.open_in(state).close()
    db = sqlite3.connect(state / "journal.sqlite3", isolation_level=None)
    hour_ago = time.time() - 3600
    ids = [(f"{i:012x}{i:012x}", uid, gid, hour_ago + i / 1000) for i in range(batches)]
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO batches(batch_id, uid, gid, pid, client_name, submitted, finished, state, fingerprint, bytes) "
        "VALUES (?, ?, ?, 1, 'agent', ?4, ?4, 'finished', 'f', 300)",
        ids,
    )
    db.executemany(
        "INSERT INTO calls(batch_id, idx, call_id, tool, arguments, disposition, summary, risk) "
        "VALUES (?, 0, 'c0', 'read_file', X'80', 'allow', 'Read a.txt', 'low')",
        [(row[0],) for row in ids],
    )
    db.executemany(
        "INSERT INTO results(batch_id, idx, call_id, ok, content, display, truncated, duration_ms, finished) "
        "VALUES (?, 0, 'c0', 1, 'what a.txt said', '', 0, 0.3, 0)",
        [(row[0],) for row in ids],
    )
    db.execute("COMMIT")
    db.close()


def test_one_users_prune_leaves_everyone_elses_calls_flowing(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    fill_history(tmp_path / "state", OTHER_UID, OTHER_GID, BATCHES)
    with reachable_daemon(tmp_path) as daemon:
        (daemon.root / "notes.txt").write_text("mine\n")
        waits: list[float] = []
        pruned = threading.Event()

        def read_meanwhile() -> None:
            with Client(daemon.endpoint, timeout=30) as client:
                while not pruned.is_set():
                    started = time.monotonic()
                    assert client.call("read_file", {"path": "notes.txt"}).ok
                    waits.append(time.monotonic() - started)

        def prune(client: Client) -> dict[str, Any]:
            started = time.monotonic()
            removed = client.prune(older_than_seconds=60)
            return {"removed": removed, "seconds": time.monotonic() - started}

        reader = threading.Thread(target=read_meanwhile)
        reader.start()
        time.sleep(0.3)  # the reader is calling
        calls_before = len(waits)
        report = as_other_user(daemon.endpoint, prune)
        pruned.set()
        reader.join(timeout=30)
    assert report.get("removed") == BATCHES, report
    during = waits[calls_before:]
    assert during, report
    # In one transaction, the reader's next call waited for the whole prune.
    assert max(during) < max(0.25, report["seconds"] / 3), (max(during), report["seconds"])
    assert len(during) >= 5, (report, during)
