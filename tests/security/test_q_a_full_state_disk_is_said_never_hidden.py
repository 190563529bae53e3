"""Q. A full state disk is said, never hidden. Attack: another local user (or anything
else on the machine) fills the filesystem that holds the daemon's state directory; here
a real tmpfs of 600 KB under a real daemon. Writes that must be journaled are refused
with the reason, reads go on, nothing is left listed as running, once there is room
again writes run as before; and a write whose file's earlier content does not fit in the
undo store still says what it did, and that it cannot be undone (it said "Cancelled")."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, small_tmpfs, start_daemon
from toold_client import BatchOutcome, Client, RemoteError
from toold_daemon.records.journal import JOURNAL_NAME

CONFIG = '[tools.approval]\nallowlist = ["write_file", "restore_files"]\n'


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/state`` on a tmpfs of 600 KB (grown with ``remount,size=…``)."""
    with small_tmpfs(tmp_path / "state", "size=600k,mode=700") as state:
        yield state


@pytest.fixture
def daemon(tmp_path: Path, small_state: Path) -> Iterator[DaemonProcess]:
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=CONFIG)  # its state directory: the small tmpfs
    try:
        yield d
    finally:
        d.stop()


def write(client: Client, n: int) -> str:
    """ "ok", or why a 60 KB write was not done."""
    content = "x" * 60_000 + str(n)
    try:
        result = client.call("write_file", {"path": f"big{n % 3}.txt", "content": content, "overwrite": True})
    except RemoteError as exc:
        return f"refused: {exc}"
    return "ok" if result.ok else f"failed: {result.content}"


def test_a_full_state_disk_refuses_writes_with_the_reason_and_writes_resume_once_there_is_room(
    daemon: DaemonProcess, small_state: Path
) -> None:
    (daemon.root / "note.txt").write_text("still readable\n")
    with Client(daemon.endpoint, timeout=30) as client:
        outcomes = []
        for n in range(40):
            outcomes.append(write(client, n))
            read = client.call("read_file", {"path": "note.txt"})
            assert read.ok and read.content == "still readable\n", read
            if outcomes[-1] != "ok" and len(outcomes) > 3:
                break
        refusals = [o for o in outcomes if o != "ok"]
        assert refusals, outcomes  # the disk did fill up
        assert all("disk is full" in o or "No space left" in o for o in refusals), refusals
        subprocess.run(["mount", "-o", "remount,size=16m", str(small_state)], check=True)
        assert write(client, 100) == "ok" and write(client, 101) == "ok"
        assert (daemon.root / "big2.txt").read_text().endswith("101")
        # a batch whose end the journal could not record is listed as it ended, as
        # get_batch gives it, not as the journal's "running"
        listed = {batch.batch_id: batch.state for batch in client.list_batches(limit=50)}
        assert "running" not in listed.values(), listed
        assert all(client.get_batch(b).state == state for b, state in listed.items()), listed
    assert daemon.proc.poll() is None, "the daemon exited"
    assert daemon.stop() == 0


def test_a_pre_image_the_full_disk_cannot_keep_leaves_the_write_done_and_says_it_cannot_be_undone(
    daemon: DaemonProcess,
) -> None:
    """The worker makes the write before the daemon keeps the file's earlier content for
    undo: when that content does not fit, the result still says what was done, and that
    this path cannot be undone (it said "Cancelled: daemon stopped" before)."""
    big = daemon.root / "big.txt"
    big.write_text("z" * 500_000)  # more than the state disk has left
    with Client(daemon.endpoint, timeout=30) as client:
        result = client.call("write_file", {"path": "big.txt", "content": "new\n", "overwrite": True})
        assert result.ok, result.content
        assert "big.txt (its earlier content could not be kept: No space left" in result.content, result.content
        assert big.read_text() == "new\n"
        undone = client.undo(client.list_batches(limit=1)[0].batch_id)
        assert big.read_text() == "new\n"  # nothing kept, so nothing made up
        assert "big.txt" in undone.results[0].content, undone.results[0].content
    assert daemon.proc.poll() is None, "the daemon exited"


def stop_a_batch_midway(client: Client, daemon: DaemonProcess, small_state: Path) -> tuple[BatchOutcome, str | None]:
    """Submit a write, a read of a 100 KB file and a write with less and less room left on
    the state disk, until the journal accepts the batch but cannot record it to its end:
    that batch's outcome, and what ``s.txt`` (its first call's file) held before it."""
    (daemon.root / "big.txt").write_text(("y" * 999 + "\n") * 100)  # a 100 KB result to record
    filler = small_state / "filler"
    for left in range(20_000, 400_000, 10_000):  # more and more room, until the batch is accepted
        calls = [
            {"name": "write_file", "arguments": {"path": "s.txt", "content": f"s{left}\n", "overwrite": True}},
            {"name": "read_file", "arguments": {"path": "big.txt"}},
            {"name": "write_file", "arguments": {"path": "t.txt", "content": "t\n"}},
        ]
        filler.unlink(missing_ok=True)
        before = (daemon.root / "s.txt").read_text() if (daemon.root / "s.txt").exists() else None
        free = shutil.disk_usage(small_state).free
        filler.write_bytes(b"\0" * max(0, free - left))
        try:
            outcome = client.submit(calls)
        except RemoteError as exc:  # no room for the batch's own record: refused whole
            assert "disk is full" in str(exc) or "No space left" in str(exc), exc
            continue
        if all(result.ok for result in outcome.results):
            (daemon.root / "t.txt").unlink()
            continue
        return outcome, before
    raise AssertionError("the disk never filled between two calls")


def test_a_batch_the_journal_stops_midway_says_which_calls_ran_and_why_the_rest_did_not(
    daemon: DaemonProcess, small_state: Path
) -> None:
    """A batch that changes files runs each call only once the journal has recorded the
    one before. When the disk fills between two calls, the calls left unrun say why
    ("Not run: the journal could not record …"); they said "Cancelled: daemon stopped",
    and the daemon sent the batch's outcome twice."""
    with Client(daemon.endpoint, timeout=30) as client:
        stopped, _ = stop_a_batch_midway(client, daemon, small_state)
        assert stopped.results[0].ok and (daemon.root / "s.txt").exists()  # it ran, and says so
        unrun = [result for result in stopped.results if not result.ok]
        assert unrun[-1] is stopped.results[-1] and not (daemon.root / "t.txt").exists()
        for result in unrun:
            assert result.error is not None and result.error.code == "NOT_JOURNALED", result
            assert result.content.startswith("Error (ExecutionFailed): Not run: the journal could not record")
            assert "disk is full" in result.content or "No space left" in result.content, result.content
        assert stopped.state == "finished" and client.get_batch(stopped.batch_id).state == "finished"
        (small_state / "filler").unlink()
        assert write(client, 1) == "ok"  # room again: writes run as before
    assert "failed outside its tools" not in daemon.log.read_text()
    assert daemon.proc.poll() is None, "the daemon exited"


def journaled(state_dir: Path, batch_id: str) -> tuple[str, list[tuple[int, int]]]:
    """The batch's state and its results' (index, ok) as the journal's file holds them."""
    db = sqlite3.connect(f"file:{state_dir / JOURNAL_NAME}?mode=ro", uri=True)
    try:
        (state,) = db.execute("SELECT state FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
        rows = db.execute("SELECT idx, ok FROM results WHERE batch_id = ? ORDER BY idx", (batch_id,)).fetchall()
    finally:
        db.close()
    return state, rows


def test_an_end_the_full_disk_kept_from_the_journal_is_recorded_once_there_is_room(
    tmp_path: Path, daemon: DaemonProcess, small_state: Path
) -> None:
    """What a batch stopped by a full state disk did and said (the result of the write
    it ran, with what that write changed; the results of the calls it left unrun; its
    end) is written to the journal as soon as there is room again. The journal lacked
    the write's result, so undo could not put its file back, and a restart called the
    batch "interrupted"."""
    with Client(daemon.endpoint, timeout=30) as client:
        stopped, before = stop_a_batch_midway(client, daemon, small_state)
        (small_state / "filler").unlink()
        deadline = time.monotonic() + 20
        while len(journaled(small_state, stopped.batch_id)[1]) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    state, rows = journaled(small_state, stopped.batch_id)
    assert state == "finished", state
    assert rows == [(i, int(r.ok)) for i, r in enumerate(stopped.results)], rows
    assert daemon.stop() == 0
    again = start_daemon(tmp_path, daemon.root, config=CONFIG)
    try:
        with Client(again.endpoint, timeout=30) as client:
            stored = client.get_batch(stopped.batch_id)
            assert stored.state == "finished", stored.state
            assert [r.content for r in stored.results] == [r.content for r in stopped.results]
            client.undo(stopped.batch_id)  # the write's change is known: its file goes back
        s_txt = daemon.root / "s.txt"
        assert (s_txt.read_text() if s_txt.exists() else None) == before
    finally:
        again.stop()
