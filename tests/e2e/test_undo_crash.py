"""An undo the daemon dies in is finished at the next start: every process of the daemon
is frozen and killed with SIGKILL at a point of the undo (a power cut, as far as the
files are concerned), a new daemon starts on the same state, and the workspace ends
exactly as before the undone batch — never half restored, with nothing left behind."""

from __future__ import annotations

import contextlib
import os
import pprint
import shutil
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.conftest import DaemonProcess, kill_process_tree, start_daemon, wait_ready
from tests.e2e.test_undo_trees import CONFIG, OPERATIONS, flat, tree
from toold_client import CallSpec


def crash(daemon: DaemonProcess) -> None:
    """Freeze the daemon and everything it started, then SIGKILL them all at once."""
    kill_process_tree(daemon.proc.pid, freeze_first=True)
    daemon.proc.wait(timeout=10)


def restarted(tmp: Path, root: Path) -> DaemonProcess:
    """A new daemon on the killed one's state; the killed one's log is kept beside. It
    listens on a socket of its own: a request the undo's client had queued for the killed
    daemon (sent before that daemon read it) would otherwise reach this one, as the
    client library means it to, and start the undo here after the test has looked."""
    os.replace(tmp / "daemon.log", tmp / "daemon-killed.log")
    d = start_daemon(tmp, root, config=CONFIG, socket_dir=tmp / "run-restarted")
    wait_ready(d)
    return d


def undos_settled(d: DaemonProcess, timeout: float = 30.0) -> list[str]:
    """Wait until no undo runs; the states of the undo batches the journal holds."""
    deadline = time.monotonic() + timeout
    with d.client(timeout=10) as c:
        while True:
            undos = []
            for summary in c.list_batches():
                status = c.get_batch(summary.batch_id)
                if status.calls and status.calls[0].name == "restore_files":
                    undos.append(status)
            if not any(u.state in ("planned", "running", "awaiting_confirmation") for u in undos):
                return [u.state for u in undos]
            if time.monotonic() > deadline:
                raise AssertionError(f"undo still running: {[u.state for u in undos]}")
            time.sleep(0.05)


def what_is_known(tmp: Path) -> str:
    """For a failure's message: the journal's batches (id, state, tools), read from its
    file, and both daemons' logs. A text, which pytest prints whole (a dict's repr it cuts
    at a few hundred characters, which hid the cause of a failure once)."""
    with contextlib.closing(sqlite3.connect(tmp / "state" / "journal.sqlite3")) as db:
        batches = db.execute(
            "SELECT b.batch_id, b.state, group_concat(c.tool) FROM batches b JOIN calls c USING (batch_id) "
            "GROUP BY b.batch_id ORDER BY b.batch_id"
        ).fetchall()
    logs = {name: (tmp / name).read_text()[-3000:] for name in ("daemon-killed.log", "daemon.log")}
    return "journal: " + pprint.pformat(batches) + "".join(f"\n--- {name}:\n{text}" for name, text in logs.items())


def leftovers(root: Path) -> list[Path]:
    """Trees an undo set aside, temporary files of a write cut short."""
    return [p for p in root.rglob("*") if p.name.startswith(".toold-undo-") or ".toold-" in p.name]


#: Deleting a tree of many files makes an undo that writes each of them back (with an
#: fsync each), long enough to be killed in.
DELETE_BULK = CallSpec("delete_file", {"path": "bulk", "recursive": True}, "bulk")


def seed_bulk(root: Path, count: int) -> None:
    for i in range(count):
        path = root / f"bulk/{i % 7}/f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"old {i}\n")
        os.chmod(path, 0o600 if i % 3 else 0o640)


def test_an_undo_killed_once_it_has_begun_changing_files_is_finished_at_the_next_start(tmp_path: Path) -> None:
    """The kill comes as soon as the workspace shows the undo's first change, so it lands
    midway: then, after the restart, the workspace is exactly as before the batch."""
    root = tmp_path / "root"
    root.mkdir()
    seed_bulk(root, 400)
    (root / "tree/inner").mkdir(parents=True)
    (root / "tree/inner/x.txt").write_text("x\n")
    before = tree(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=120) as c:
            calls = [
                DELETE_BULK,
                CallSpec("move_file", {"source": "tree", "destination": "moved/tree"}, "m"),
                CallSpec("write_file", {"path": "made/deep/new.txt", "content": "n\n"}, "n"),
            ]
            outcome = c.submit(calls)
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results if not r.ok][:3]
        after = tree(root)
        undoing = threading.Thread(target=_undo_quietly, args=(d, outcome.batch_id), daemon=True)
        undoing.start()
        deadline = time.monotonic() + 30
        while _unchanged(root, after):
            assert time.monotonic() < deadline, "the undo never began"
            time.sleep(0.002)
    finally:
        crash(d)  # also when the set-up failed: no daemon is left behind
    midway = tree(root)
    assert midway not in (before, after), "the kill did not land midway; the test proves nothing"
    d = restarted(tmp_path, root)
    try:
        assert undos_settled(d) == ["finished"]
        with d.client(timeout=30) as c:
            (undo,) = [s for s in c.list_batches() if s.batch_id != outcome.batch_id]
            (result,) = c.get_batch(undo.batch_id).results
    finally:
        d.stop()
    assert result.ok, result.content
    assert "after the daemon restarted" in result.content
    assert result.data is not None and result.data["resumed"] is True
    assert tree(root) == before
    assert not leftovers(root)


def _unchanged(root: Path, after: dict[str, tuple[str, int, bytes]]) -> bool:
    try:
        return tree(root) == after
    except FileNotFoundError:  # an entry went while the tree was read: it changed
        return False


def _undo_quietly(d: DaemonProcess, batch_id: str) -> None:
    try:
        with d.client(timeout=60) as c:
            c.undo(batch_id)
    except Exception:  # the daemon is killed under it
        pass


@settings(max_examples=int(os.environ.get("TOOLD_CRASH_EXAMPLES", "6")), deadline=None)
@given(
    extra=st.lists(OPERATIONS, max_size=4),
    bulk=st.integers(min_value=20, max_value=200),
    delay=st.floats(min_value=0.0, max_value=0.6),
)
def test_an_undo_killed_at_any_point_ends_as_before_or_as_after_never_between(
    extra: list[list[CallSpec]], bulk: int, delay: float
) -> None:
    """Hypothesis draws a batch (bulk writes plus writes, deletes and moves of files and
    directories) and a moment to kill the daemon during its undo. After the restart the
    workspace is as before the batch (the undo finished, perhaps resumed) or, if the
    kill came before the undo began, as after it; nothing else, and no leftovers."""
    tmp = Path(tempfile.mkdtemp(prefix="toold-crash-"))
    try:
        root = tmp / "root"
        root.mkdir()
        seed_bulk(root, bulk)
        (root / "a").mkdir()
        (root / "a/b.txt").write_text("b\n")
        before = tree(root)
        d = start_daemon(tmp, root, config=CONFIG)
        try:
            with d.client(timeout=120) as c:
                calls = [DELETE_BULK, *[CallSpec(x.name, x.arguments, f"x{i}") for i, x in enumerate(flat(extra))]]
                outcome = c.submit(calls)
            after = tree(root)
            undoing = threading.Thread(target=_undo_quietly, args=(d, outcome.batch_id), daemon=True)
            undoing.start()
            time.sleep(delay)
        finally:
            crash(d)
        d = restarted(tmp, root)
        try:
            states = undos_settled(d)
            with d.client(timeout=30) as c:
                results = [c.get_batch(s.batch_id).results for s in c.list_batches() if s.batch_id != outcome.batch_id]
        finally:
            d.stop()
        now = tree(root)
        resumed = any(r.data and r.data.get("resumed") for rs in results for r in rs)
        event("undo resumed after the kill" if resumed else "kill before or after the undo")
        if now == after:  # the kill came before the undo changed anything
            assert states in ([], ["interrupted"], ["finished"]), states
            for result in (r for rs in results for r in rs):
                assert not result.ok, result.content  # a finished undo that changed nothing failed cleanly
        else:
            contents = [r.content for rs in results for r in rs]
            assert now == before, f"undo states {states}, results {contents}\n{what_is_known(tmp)}"
            assert states == ["finished"], f"undo states {states}\n{what_is_known(tmp)}"
        assert not leftovers(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
