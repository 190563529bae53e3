"""Journal, crash recovery and exactly-once, with real daemons killed with SIGKILL."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

import toold_protocol as p
from tests.conftest import BIN, DaemonProcess, start_daemon
from tests.e2e.test_daemon import big_tree, grep_calls, submit_raw
from tests.e2e.test_toolctl import toolctl
from toold_client import Client, RemoteError
from toold_daemon.records.journal import Journal

CALLS = 6


def restart(tmp_path: Path, root: Path, config: str = "") -> DaemonProcess:
    """A new daemon on the same state directory (start_daemon reuses tmp_path/state)."""
    return start_daemon(tmp_path, root, config=config) if config else start_daemon(tmp_path, root)


def wait_for_results(client: Client, batch_id: str, at_least: int, timeout: float = 30) -> p.BatchStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = client.get_batch(batch_id)
        if len(status.results) >= at_least or time.monotonic() > deadline:
            return status
        time.sleep(0.005)


def check_after_restart(status: p.BatchStatus, before: dict[str, p.ToolResult]) -> None:
    """Every call has at most one result; results written before the crash are unchanged;
    a call that was running got the 'interrupted' error; the rest wait (state interrupted)."""
    ids = [r.call_id for r in status.results]
    assert len(ids) == len(set(ids))
    for result in status.results:
        if result.call_id in before:
            assert result == before[result.call_id]
        else:
            assert result.error is not None and result.error.code == "INTERRUPTED"
            assert "side effects may have happened" in result.error.message
    pending = len(status.calls) - len(status.results)
    assert status.state == ("interrupted" if pending else "finished")


def crash_mid_batch(tmp_path: Path, root: Path, delay: float | None) -> tuple[str, dict[str, p.ToolResult]]:
    """Kill a batch of side-effecting calls part-way (a read-only batch is journaled only
    once it has ended: see test_a_read_only_batch_killed_before_its_commit_is_read_again)."""
    daemon = start_daemon(tmp_path, root, config=MARK_CONFIG)
    with daemon.client() as client:
        accepted = submit_raw(client, mark_calls(CALLS), batch_id="crashy")
        if delay is None:
            wait_for_results(client, accepted.batch_id, 1)
        else:
            time.sleep(delay)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
    # What the journal holds after the kill is what a restart must start from.
    journal = Journal(tmp_path / "state" / "journal.sqlite3")
    stored = journal.load(accepted.batch_id)
    journal.close()
    assert stored is not None
    before = {r.call_id: r for r in stored.results if r is not None}
    return accepted.batch_id, before


def test_kill_mid_batch_then_resume_runs_only_never_started_calls(tmp_path: Path, root: Path) -> None:
    batch_id, before = crash_mid_batch(tmp_path, root, None)
    daemon = restart(tmp_path, root, MARK_CONFIG)
    try:
        with daemon.client() as client:
            status = client.get_batch(batch_id)
            check_after_restart(status, before)
            noted = json.loads((tmp_path / "state" / "last-recovery.json").read_text())  # for toold doctor
            interrupted = [r for r in status.results if r.error is not None and r.error.code == "INTERRUPTED"]
            assert noted["interrupted_calls"] == len(interrupted)
            assert noted["waiting_batches"] == (1 if status.state == "interrupted" else 0)
            finished_before_resume = {r.call_id: r for r in status.results}
            if status.state == "interrupted":
                done = client.recover(batch_id, "resume")
                assert done is not None and done.state == "finished"
                assert [r.call_id for r in done.results] == [f"m{i}" for i in range(CALLS)]
                for result in done.results:
                    if result.call_id in finished_before_resume:
                        assert result == finished_before_resume[result.call_id]  # never re-run
                    else:
                        assert result.ok
            final = client.get_batch(batch_id)
            assert final.state == "finished" and len(final.results) == CALLS
            with pytest.raises(Exception, match="NOT_INTERRUPTED"):
                client.recover(batch_id, "resume")
    finally:
        daemon.stop()


def test_randomized_kill_points(tmp_path: Path, root: Path) -> None:
    rng = random.Random(20261122)
    for round_ in range(4):
        state = tmp_path / f"round{round_}"
        state.mkdir()
        batch_id, before = crash_mid_batch(state, root, rng.uniform(0.0, 0.6))
        daemon = restart(state, root, MARK_CONFIG)
        try:
            with daemon.client() as client:
                status = client.get_batch(batch_id)
                check_after_restart(status, before)
                if status.state == "interrupted":
                    if rng.random() < 0.5:
                        done = client.recover(batch_id, "resume")
                        assert done is not None and len(done.results) == CALLS
                    else:
                        assert client.recover(batch_id, "discard") is None
                final = client.get_batch(batch_id)
                assert len(final.results) == CALLS and len({r.call_id for r in final.results}) == CALLS
                assert final.state in ("finished", "cancelled")
                for result in final.results:
                    if result.error is not None and result.error.code == "DISCARDED":
                        assert result.error.message == "discarded after restart"
                # The client that lost its connection resubmits: it gets the record, nothing runs again.
                again = client.submit(
                    [
                        {"id": c.call_id, "name": c.name, "arguments": msgspec.msgpack.decode(c.arguments)}
                        for c in mark_calls(CALLS)
                    ],
                    batch_id=batch_id,
                )
                assert again.results == final.results
        finally:
            daemon.stop()


def test_kill_after_the_last_result_needs_no_recovery(tmp_path: Path, root: Path) -> None:
    """A batch with side effects is answered only once its result is durable."""
    daemon = start_daemon(tmp_path, root)
    with daemon.client() as client:
        calls = [{"id": "x", "name": "write_file", "arguments": {"path": "a.txt", "content": "A"}}]
        outcome = client.submit(calls, batch_id="quick")
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    daemon = restart(tmp_path, root)
    try:
        with daemon.client() as client:
            status = client.get_batch("quick")
            assert status.state == "finished" and status.results == outcome.results
    finally:
        daemon.stop()


def test_a_read_only_batch_killed_before_its_commit_is_read_again(tmp_path: Path, root: Path) -> None:
    """A read-only batch is answered before its journal commit (within LINGER_SECONDS). After
    a kill right after the answer it may be finished, unknown or waiting for resume; either
    way the same id gives the same content again, by running the read once more at most."""
    (root / "a.txt").write_text("A")
    daemon = start_daemon(tmp_path, root)
    calls = [{"id": "x", "name": "read_file", "arguments": {"path": "a.txt"}}]
    with daemon.client() as client:
        outcome = client.submit(calls, batch_id="quick")
        settled = client.submit(calls, batch_id="settled")
        time.sleep(0.3)  # well past LINGER_SECONDS: this one is committed
        client.get_batch("settled")
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    daemon = restart(tmp_path, root)
    try:
        with daemon.client() as client:
            assert client.get_batch("settled").results == settled.results
            try:
                state = client.get_batch("quick").state
            except RemoteError as exc:
                assert exc.code == "UNKNOWN_BATCH"
                state = "unknown"
            if state == "unknown":
                results = client.submit(calls, batch_id="quick").results
            elif state == "interrupted":
                resumed = client.recover("quick", "resume")
                assert resumed is not None
                results = resumed.results
            else:
                assert state == "finished"
                results = client.get_batch("quick").results
            assert [r.content for r in results] == [r.content for r in outcome.results]
            assert outcome.results[0].ok and "A" in outcome.results[0].content
    finally:
        daemon.stop()


def serve_exit(tmp_path: Path, root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(BIN / "toold"),
            "serve",
            "--root",
            str(root),
            "--endpoint",
            f"ipc://{tmp_path}/j.sock",
            "--state-dir",
            str(state),
        ],
        capture_output=True,
        text=True,
        timeout=15,
    )


def test_corrupt_newer_or_missing_journal_is_a_clear_error(tmp_path: Path, root: Path) -> None:
    missing = serve_exit(tmp_path, root, tmp_path / "nowhere")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "journal.sqlite3").write_bytes(b"this is not a database" * 100)
    out = serve_exit(tmp_path, root, corrupt)
    assert out.returncode == 2 and "journal" in out.stderr and "move it aside" in out.stderr
    assert (corrupt / "journal.sqlite3").read_bytes().startswith(b"this is not")  # no silent reset
    newer = tmp_path / "newer"
    newer.mkdir()
    db = sqlite3.connect(newer / "journal.sqlite3")
    db.execute("PRAGMA user_version = 99")
    db.close()
    out = serve_exit(tmp_path, root, newer)
    assert out.returncode == 2 and "schema version 99" in out.stderr


def test_second_daemon_on_the_same_state_dir_is_refused(daemon: DaemonProcess, tmp_path: Path) -> None:
    out = serve_exit(tmp_path, daemon.root, tmp_path / "state")
    assert out.returncode == 2 and "another toold is using the journal" in out.stderr


def test_toolctl_journal_commands(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("A")
    batch = json.dumps(
        [
            {"id": "one", "name": "read_file", "arguments": {"path": "a.txt"}},
            {"id": "two", "name": "read_file", "arguments": {"path": "missing"}},
        ]
    )
    assert toolctl(daemon, "batch", "--batch-id", "b-42", stdin=batch).returncode == 1
    listed = json.loads(toolctl(daemon, "journal", "list", "--json").stdout)
    # A chosen id lives in its uid's namespace (root's here); the short form still names it.
    assert listed[0]["batch_id"] == "0:b-42" and listed[0]["state"] == "finished" and listed[0]["calls"] == 2
    shown = json.loads(toolctl(daemon, "journal", "show", "b-42", "--json").stdout)
    assert [c["call_id"] for c in shown["calls"]] == ["one", "two"]
    assert shown["calls"][0]["result"]["ok"] and shown["calls"][1]["result"]["error"]["code"] == "FILE_NOT_FOUND"
    assert set(shown["calls"][0]["result"]) == {
        "call_id",
        "ok",
        "content",
        "display",
        "error",
        "truncated",
        "duration_ms",
        "data",
    }
    assert toolctl(daemon, "recover", "b-42", "--resume").returncode == 2  # not interrupted
    time.sleep(0.05)
    pruned = toolctl(daemon, "journal", "prune", "--older-than", "0")
    assert pruned.returncode == 0 and "pruned 1" in pruned.stdout
    assert toolctl(daemon, "journal", "show", "b-42").returncode == 2


def test_resubmitting_a_running_batch_joins_its_live_events(daemon: DaemonProcess) -> None:
    big_tree(daemon.root, 2000)
    calls = [
        {"id": c.call_id, "name": "grep", "arguments": {"pattern": "needle", "max_results": 10_000}}
        for c in grep_calls(3)
    ]
    with daemon.client() as first:
        accepted = submit_raw(first, grep_calls(3), batch_id="shared")
        with daemon.client() as second:
            seen: list[str] = []
            outcome = second.submit(calls, batch_id="shared", on_event=lambda e: seen.append(type(e).__name__))
        original = first.wait_batch(accepted.batch_id)
    assert outcome.results == original.results and len(outcome.results) == 3
    assert seen[-1] == "BatchFinished"
    with daemon.client() as client:  # ran once: three started marks, three results
        status = client.get_batch("shared")
        assert [r.call_id for r in status.results] == ["c0", "c1", "c2"]


MARK_CONFIG = '[tools.approval]\nallowlist = ["shell"]\n'


def mark_calls(count: int) -> list[p.ToolCall]:
    """Shell calls that each append their own line to marks.txt, then take a moment."""
    return [
        p.ToolCall(
            call_id=f"m{i}",
            name="shell",
            arguments=msgspec.Raw(p.encode_value({"command": f"echo m{i} >> marks.txt; sleep 0.08"})),
        )
        for i in range(count)
    ]


def killed_daemons_cgroups(killed_pid: int, live_pid: int) -> list[str]:
    """The killed daemon's cgroups where the live one looks after them: beside its own in
    each hierarchy. A daemon touches nothing outside its own cgroup's subtree (what
    systemd delegates to it); a v1 hierarchy in which the host moved processes between
    starts may hold the killed daemon's base elsewhere, which is not its to remove."""
    own = glob.glob(f"/sys/fs/cgroup/**/toold-{live_pid}", recursive=True)
    beside = {os.path.join(os.path.dirname(base), f"toold-{killed_pid}") for base in own}
    return sorted(path for path in beside if os.path.isdir(path))


def test_randomized_kills_with_side_effects_never_run_a_call_twice(tmp_path: Path, root: Path) -> None:
    """kill -9 at random points of a batch whose calls leave marks on disk; after restart
    and a random resume or discard, every call has one result and no mark exists twice."""
    rng = random.Random(7)
    for round_ in range(5):
        state = tmp_path / f"marks{round_}"
        state.mkdir()
        workspace = root / f"w{round_}"
        workspace.mkdir()
        daemon = start_daemon(state, workspace, config=MARK_CONFIG)
        with daemon.client() as client:
            accepted = submit_raw(client, mark_calls(CALLS), batch_id=f"marks{round_}")
            time.sleep(rng.uniform(0.0, 0.7))
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait()
        marks_file = workspace / "marks.txt"
        marked_before = marks_file.read_text().split() if marks_file.exists() else []
        killed_pid = daemon.proc.pid
        daemon = start_daemon(state, workspace, config=MARK_CONFIG)
        try:
            with daemon.client() as client:
                cgroup = {layer.name: layer for layer in client.hello().isolation}["cgroup"]
                if cgroup.available:  # the killed daemon's cgroups are cleaned up by the next one
                    # (at its start, or within seconds when their last processes were still exiting)
                    deadline = time.monotonic() + 15
                    while left := killed_daemons_cgroups(killed_pid, daemon.proc.pid):
                        if time.monotonic() > deadline:
                            inside = {d: [e.name for e in os.scandir(d) if e.is_dir()] for d in left}
                            raise AssertionError(f"left behind: {inside}\n{daemon.log.read_text()[-2000:]}")
                        time.sleep(0.2)
                status = client.get_batch(accepted.batch_id)
                done = {r.call_id: r for r in status.results}
                for call_id, result in done.items():
                    if result.ok:
                        assert marked_before.count(call_id) == 1
                    else:
                        assert result.error is not None and result.error.code == "INTERRUPTED"
                never_started = [c.call_id for c in status.calls if c.call_id not in done]
                assert not any(c in marked_before for c in never_started)
                resumed = status.state == "interrupted" and round_ % 2 == 0
                if status.state == "interrupted":
                    client.recover(accepted.batch_id, "resume" if resumed else "discard")
                final = client.get_batch(accepted.batch_id)
        finally:
            daemon.stop()
        marks = marks_file.read_text().split() if marks_file.exists() else []
        assert len(final.results) == CALLS and len({r.call_id for r in final.results}) == CALLS
        assert all(marks.count(f"m{i}") <= 1 for i in range(CALLS)), marks
        for call_id in never_started:
            assert marks.count(call_id) == (1 if resumed else 0), (call_id, marks, resumed)


def test_a_batch_the_journal_cannot_record_is_refused_and_nothing_runs(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A side-effecting batch is acknowledged only once its record is committed; when the
    commit fails (here: the journal's WAL made immutable under the daemon), the client
    gets an error and the call never runs."""
    with daemon.client() as client:
        assert client.call("write_file", {"path": "first.txt", "content": "1"}).ok  # the WAL exists now
        wal = tmp_path / "state" / "journal.sqlite3-wal"
        assert wal.exists()
        if subprocess.run(["chattr", "+i", str(wal)], capture_output=True).returncode != 0:
            pytest.skip("this filesystem has no immutable flag (chattr +i)")
        try:
            with pytest.raises(RemoteError) as refused:
                client.call("write_file", {"path": "second.txt", "content": "2"})
        finally:
            subprocess.run(["chattr", "-i", str(wal)], check=True)
        assert refused.value.code == "INTERNAL" and "journal could not record" in refused.value.message
        assert not (daemon.root / "second.txt").exists()
        assert client.call("write_file", {"path": "third.txt", "content": "3"}).ok  # the daemon goes on


def test_a_daemon_without_a_journal_says_so_to_every_journal_listing(tmp_path: Path, root: Path) -> None:
    """Listing batches or servers' connections from a daemon that keeps no journal is a
    typed error; toolctl watch, which asks for the connections, stops asking."""
    from toold_client.watch import WatchState, _look_at_server_connections

    d = start_daemon(tmp_path, root, config="[journal]\nenabled = false\n")
    try:
        with d.client() as client:
            for listing in (client.list_batches, client.list_connections):
                with pytest.raises(RemoteError) as refused:
                    listing()
                assert refused.value.code == "JOURNAL_DISABLED"
            state = WatchState()
            assert _look_at_server_connections(client, state) is False  # watch stops asking
            assert state.server_connections == [] and client.ping() >= 0
        shown = subprocess.run(
            [str(BIN / "toolctl"), "--endpoint", d.endpoint, "journal", "connections"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        d.stop()
    assert shown.returncode == 2 and "JOURNAL_DISABLED" in shown.stderr, shown
