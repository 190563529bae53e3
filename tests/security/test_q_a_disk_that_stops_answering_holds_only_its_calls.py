"""Class Q: a disk that stops answering holds the calls that touch it, and nothing else.

An NFS or sshfs mount whose server went away, or a FUSE server its owner stopped, makes
every lookup on it wait, maybe for good. The daemon plans each call on its event loop,
and planning looks paths up: one ``read_file`` there held every client's ping for as
long as the disk stayed stopped. Here the disk is a real FUSE file system (a FAT image,
fusefat) stopped with SIGSTOP, after the kernel's cached answers about it have expired.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, reachable_daemon, start_daemon
from tests.e2e.test_identity import as_user
from tests.e2e.test_undo_crash import crash
from tests.e2e.test_undo_trees import tree
from tests.folding_disk import fat_disk
from toold_client import CallSpec, Client
from toold_daemon.service.planning_aside import COSTLY_ARGUMENT_BYTES, THREADS

EVERYTHING = """
[tools.approval]
preset = "all"
"""
#: fusefat's answers stay in the kernel's caches this long (FUSE's default, 1 s), with room.
CACHE_EXPIRY_S = 2.5


def _fusefat_serving(mount: Path) -> int:
    found = subprocess.run(["pgrep", "-f", f"fusefat.*{mount}"], capture_output=True, text=True).stdout.split()
    return int(found[0])


@dataclass
class StoppableDisk:
    daemon: DaemonProcess
    server_pid: int

    def stop(self) -> None:
        os.kill(self.server_pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.server_pid, signal.SIGCONT)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[StoppableDisk]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "here.txt").write_text("on the local disk\n")
    with fat_disk(root) as mount:
        for name in ("read.txt", "delete.txt", "move.txt", "shell.txt"):
            (mount / name).write_text(f"{name} on the stopped disk\n")
        (mount / "workspace").mkdir()
        (tmp_path / "daemon").mkdir()
        daemon = start_daemon(tmp_path / "daemon", root, config=EVERYTHING)
        held = StoppableDisk(daemon, _fusefat_serving(mount))
        try:
            yield held
        finally:
            held.resume()
            daemon.stop()
            held.daemon.stop()  # the one a test started in its place, if it did


def _in_background(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_calls_on_a_stopped_disk_hold_nobody_else(disk: StoppableDisk) -> None:
    daemon = disk.daemon
    time.sleep(CACHE_EXPIRY_S)
    disk.stop()

    def call(name: str, arguments: dict[str, object]) -> Callable[[], object]:
        def work() -> object:
            with daemon.client(timeout=60) as c:
                return c.call(name, arguments, timeout=60)

        return work

    def explain() -> object:
        with daemon.client(timeout=60) as c:
            return c.explain("read_file", {"path": "fat/read.txt"})

    def open_workspace() -> object:
        with Client(daemon.endpoint, timeout=60, workspace=daemon.root / "fat" / "workspace") as c:
            return c.call("list_directory", {"path": "."}, timeout=60)

    stuck = [
        _in_background(work)
        for work in (
            call("read_file", {"path": "fat/read.txt"}),
            call("write_file", {"path": "fat/new.txt", "content": "new\n"}),
            call("delete_file", {"path": "fat/delete.txt"}),
            call("move_file", {"source": "fat/move.txt", "destination": "fat/moved.txt"}),
            call("shell", {"command": "cat fat/shell.txt"}),
            explain,
            open_workspace,
        )
    ]
    time.sleep(0.5)
    with daemon.client(timeout=5) as other:
        for _ in range(5):
            started = time.monotonic()
            other.ping(timeout=2)
            read = other.call("read_file", {"path": "here.txt"}, timeout=2)
            assert read.ok and "local disk" in read.content
            assert time.monotonic() - started < 1.0
    assert all(thread.is_alive() for thread, _ in stuck)  # the disk still holds them

    disk.resume()
    for thread, _ in stuck:
        thread.join(30)
    outcomes = [outcome[0] if outcome else None for _, outcome in stuck]
    for outcome in outcomes:
        assert not isinstance(outcome, Exception) and outcome is not None, outcomes
        assert getattr(outcome, "ok", True), outcome
    assert (daemon.root / "fat" / "new.txt").read_text() == "new\n"
    assert not (daemon.root / "fat" / "delete.txt").exists()
    assert (daemon.root / "fat" / "moved.txt").exists()
    assert "shell.txt on the stopped disk" in outcomes[4].content  # type: ignore[union-attr]


def test_the_daemon_stops_while_a_call_waits_on_a_stopped_disk(disk: StoppableDisk) -> None:
    daemon = disk.daemon
    time.sleep(CACHE_EXPIRY_S)
    disk.stop()

    def read() -> object:
        with daemon.client(timeout=60) as c:
            return c.call("read_file", {"path": "fat/read.txt"}, timeout=60)

    _in_background(read)
    time.sleep(0.5)
    started = time.monotonic()
    assert daemon.stop(timeout=10) == 0
    assert time.monotonic() - started < 5


def test_resuming_a_batch_whose_workspace_is_on_a_stopped_disk_holds_nobody_else(
    disk: StoppableDisk, tmp_path: Path
) -> None:
    """``toolctl recover --resume`` opens the interrupted batch's workspace again: on a
    thread, as a session's opening does."""
    workspace = disk.daemon.root / "fat" / "workspace"
    calls = [
        CallSpec("shell", {"command": "sleep 30"}),
        CallSpec("write_file", {"path": "after.txt", "content": "resumed\n"}),
    ]

    def submit() -> object:
        with Client(disk.daemon.endpoint, timeout=60, workspace=workspace) as c:
            return c.submit(calls, batch_id="on-the-disk")

    _in_background(submit)
    time.sleep(2)  # the command runs: the batch is interrupted by what follows
    disk.daemon.proc.send_signal(signal.SIGKILL)
    disk.daemon.proc.wait()
    disk.daemon = start_daemon(tmp_path / "daemon", disk.daemon.root, config=EVERYTHING)
    with disk.daemon.client(timeout=10) as c:
        assert c.get_batch("on-the-disk").state == "interrupted"

    time.sleep(CACHE_EXPIRY_S)
    disk.stop()

    def resume() -> object:
        with disk.daemon.client(timeout=60) as c:
            return c.recover("on-the-disk", "resume")

    thread, outcome = _in_background(resume)
    time.sleep(0.5)
    with disk.daemon.client(timeout=5) as other:
        for _ in range(5):
            started = time.monotonic()
            other.ping(timeout=2)
            assert time.monotonic() - started < 1.0
        with pytest.raises(Exception, match="being resumed"):  # and never twice
            other.recover("on-the-disk", "resume")
    assert thread.is_alive()
    disk.resume()
    thread.join(30)
    assert outcome and getattr(outcome[0], "state", None) == "finished", outcome
    assert (workspace / "after.txt").read_text() == "resumed\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become other users")
def test_users_whose_disk_stopped_never_hold_another_users_large_batch(tmp_path: Path) -> None:
    """More users than the daemon keeps threads for costly plans each read a file on the
    stopped disk (an NFS server gone, under everyone's home): each plan waits on a thread.
    Another user's large batch, planned on a thread too, still runs at once."""
    with reachable_daemon(tmp_path, config=EVERYTHING) as daemon, fat_disk(daemon.root) as mount:
        (mount / "read.txt").write_text("on the stopped disk\n")
        server = _fusefat_serving(mount)
        time.sleep(CACHE_EXPIRY_S)
        os.kill(server, signal.SIGSTOP)
        try:

            def read(client: Client) -> dict[str, object]:
                result = client.call("read_file", {"path": "fat/read.txt"}, timeout=60)
                return {"ok": result.ok, "content": result.content}

            uids = range(62000, 62000 + THREADS + 1)
            stuck = [_in_background(lambda uid=uid: as_user(daemon.endpoint, uid, uid, read)) for uid in uids]
            time.sleep(1.5)
            large = "x" * (2 * COSTLY_ARGUMENT_BYTES)
            with daemon.client(timeout=5) as other:
                started = time.monotonic()
                written = other.call("write_file", {"path": "large.txt", "content": large}, timeout=4)
                took = time.monotonic() - started
            assert written.ok, written.content
            assert took < 2.0, took
            assert (daemon.root / "large.txt").read_text() == large
            assert all(thread.is_alive() for thread, _ in stuck)  # the disk still holds them
        finally:
            os.kill(server, signal.SIGCONT)
        for thread, _ in stuck:
            thread.join(30)
        outcomes = [outcome[0] if outcome else None for _, outcome in stuck]
        # Each got its answer once the disk answered (the worker, as that user, may not
        # enter a FUSE disk mounted without allow_other: a refusal is an answer too).
        assert all(isinstance(o, dict) and "ok" in o for o in outcomes), outcomes


def test_an_undo_the_daemon_died_in_on_a_stopped_disk_does_not_keep_the_next_one_from_starting(
    disk: StoppableDisk, tmp_path: Path
) -> None:
    """At start the daemon finishes the undos the last one died in, before it serves. The
    workspace of one is on the stopped disk: the daemon starts anyway, within the few
    seconds it gives those disks, and the undo stays interrupted until its owner resumes
    it, which then puts the tree back exactly."""
    workspace = disk.daemon.root / "fat" / "workspace"
    for i in range(150):
        (workspace / "bulk" / str(i % 5)).mkdir(parents=True, exist_ok=True)
        (workspace / "bulk" / str(i % 5) / f"f{i}.txt").write_text(f"old {i}\n")
    before = tree(workspace)
    with Client(disk.daemon.endpoint, timeout=60, workspace=workspace) as c:
        deleted = c.submit([CallSpec("delete_file", {"path": "bulk", "recursive": True})])
        assert deleted.results[0].ok, deleted.results[0].content
    after = tree(workspace)

    def undo() -> object:
        with Client(disk.daemon.endpoint, timeout=60, workspace=workspace) as c:
            return c.undo(deleted.batch_id)

    _in_background(undo)
    deadline = time.monotonic() + 30
    while _tree_or_none(workspace) == after:
        assert time.monotonic() < deadline, "the undo never began"
        time.sleep(0.005)
    crash(disk.daemon)
    midway = tree(workspace)
    assert midway not in (before, after), "the kill did not land midway; the test proves nothing"

    time.sleep(CACHE_EXPIRY_S)
    disk.stop()
    started = time.monotonic()
    disk.daemon = start_daemon(tmp_path / "daemon", disk.daemon.root, config=EVERYTHING)
    assert time.monotonic() - started < 9  # the disks get 5 s, the start itself a few more
    with disk.daemon.client(timeout=5) as c:
        (undone,) = [b for b in c.list_batches() if b.batch_id != deleted.batch_id]
        assert undone.state == "interrupted"
        assert c.call("read_file", {"path": "here.txt"}, timeout=2).ok
    assert "did not answer within 5 s" in disk.daemon.log.read_text()

    disk.resume()
    with disk.daemon.client(timeout=60) as c:
        c.recover(undone.batch_id, "resume")
        deadline = time.monotonic() + 60
        while (status := c.get_batch(undone.batch_id)).state not in ("finished", "cancelled"):
            assert time.monotonic() < deadline, status.state
            time.sleep(0.05)
    assert status.results[0].ok, status.results[0].content
    assert tree(workspace) == before


def _tree_or_none(root: Path) -> dict[str, tuple[str, int, bytes]] | None:
    try:
        return tree(root)
    except FileNotFoundError:  # an entry went while the tree was read: it changed
        return None
