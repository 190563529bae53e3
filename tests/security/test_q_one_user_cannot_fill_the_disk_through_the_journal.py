"""Class Q, the disk: the journal keeps what every batch held (its calls' arguments, its
results, the pre-images kept for undo) for ``retention_days``, and retention was applied
only when the daemon started. One uid reading large files in a loop (or writing large
ones) therefore grew the journal without bound while the daemon ran: floods of 7 MB
arguments wrote 1.2 GB of journal in 6 s. Each uid now has a share of the journal
(``[journal] max_bytes_per_uid``); past it, its own oldest finished batches are pruned,
never another uid's, and retention is applied every hour."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import reachable_daemon
from tests.e2e.test_identity import OTHER_UID
from tests.e2e.test_metrics import wait_for
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser
from toold_client import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")

MB = 1024 * 1024
SHARE = 2 * MB
BATCHES = 40  # of eight 100 KB reads: 32 MB of results, sixteen times the share
READ = {"name": "read_file", "arguments": {"path": "big.txt"}}


def test_another_users_flood_of_large_results_stays_within_its_share_of_the_journal(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics" / "toold.prom"
    metrics.parent.mkdir()
    config = (
        f'[journal]\nmax_bytes_per_uid = {SHARE}\n[daemon]\nmetrics_file = "{metrics}"\nmetrics_interval_seconds = 1\n'
    )
    with reachable_daemon(tmp_path, config=config) as daemon:
        (daemon.root / "big.txt").write_text(("z" * 99 + "\n") * 1000)  # 100 KB, readable by all
        with daemon.client(timeout=60) as client:
            mine = client.submit([READ], events="results")
        assert mine.results[0].ok
        attacker = OtherUser(lambda: _flood(daemon.endpoint))
        try:
            said = attacker.line().split()
        finally:
            attacker.kill()
        assert said == ["submitted", str(BATCHES)], said
        journal = tmp_path / "state" / "journal.sqlite3"
        deadline = time.monotonic() + 10
        while (held := _held(journal)).get(OTHER_UID, 0) > SHARE + 800_000 and time.monotonic() < deadline:
            time.sleep(0.05)  # the last prune is a write on its way
        counter = ("toold_journal_pruned_for_space_total", ())
        # every batch of the attacker's is either still there or counted as pruned (the
        # metrics file is written every second, and the last delete may still be queued)
        samples = wait_for(metrics, lambda s: s.get(counter, 0) + len(_batches(journal, OTHER_UID)) == BATCHES + 1)
        kept = _batches(journal, OTHER_UID)
        with daemon.client(timeout=60) as client:
            status = client.get_batch(mine.batch_id)  # this uid's batch is untouched (from the journal)
        audited = daemon.log.read_text().count(f"audit=batch uid={OTHER_UID} ")
    # the journal forgot the attacker's oldest batches; the audit trail did not
    assert audited == BATCHES + 1, audited
    assert 0 < held[OTHER_UID] <= SHARE + 800_000, held  # 32 MB before
    assert len(kept) < 8, f"{len(kept)} of the attacker's {BATCHES + 1} batches kept"
    assert samples[counter] == BATCHES + 1 - len(kept)  # operators see it
    assert status.state == "finished" and status.results[0].ok and len(status.results[0].content) == 100_000


def _flood(endpoint: str) -> None:
    """In the other uid's process: submit the batches one after another, reading each."""
    with Client(endpoint, timeout=60) as client:
        client.submit([READ], events="results")  # its first, the oldest
        for _ in range(BATCHES):
            batch = client.submit([READ] * 8, events="results")
            assert all(result.ok for result in batch.results), batch.results[0].content
    print(f"submitted {BATCHES}")


def _held(journal: Path) -> dict[int, int]:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT uid, SUM(bytes) FROM batches GROUP BY uid").fetchall())
    finally:
        db.close()


def _batches(journal: Path, uid: int) -> list[str]:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return [row[0] for row in db.execute("SELECT batch_id FROM batches WHERE uid = ?", (uid,))]
    finally:
        db.close()
