"""Q. Requests now answered from tasks of their own (those that wait for the journal, and
large ones planned on a thread) must fail alone. A failure in such a task reached the
service's nursery and would have ended the daemon for everyone: one user whose listing
met a disk error, or whose large request hit a bug, took every other user's calls down.
It is now that request's INTERNAL error, as for a request answered at once.

The faults are injected into a real daemon served in the test's process (real socket,
real journal on disk): a read the disk refuses, a planning step that raises."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.held_journal import daemon_with_a_journal_behind
from toold_client import Client, RemoteError
from toold_daemon.policy.planner import Planner
from toold_daemon.records.journal import Journal


def disk_error(*_args: Any, **_kwargs: Any) -> Any:
    raise sqlite3.OperationalError("disk I/O error")


def planning_bug(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("a bug while planning")


def failing_requests(endpoint: str) -> list[str]:
    codes = []
    with Client(endpoint, timeout=10) as client:
        for ask in (
            client.list_batches,
            lambda: client.get_batch("0" * 24),
            client.list_connections,
            lambda: client.explain("write_file", {"path": "x.txt", "content": "y" * 40_000}),
        ):
            with pytest.raises(RemoteError) as refused:
                ask()
            codes.append(refused.value.code)
        assert client.call("read_file", {"path": "a.txt"}).ok  # and the daemon serves on
    return codes


async def test_a_request_failing_in_its_own_task_is_told_so_and_the_daemon_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for read in ("summaries", "load", "exists", "server_connections"):
        monkeypatch.setattr(Journal, read, disk_error)
    monkeypatch.setattr(Planner, "explain", planning_bug)
    async with daemon_with_a_journal_behind(tmp_path, monkeypatch, every_read_waits=False) as (endpoint, gate):
        gate.set()  # the disk answers: only the injected faults fail
        codes = await trio.to_thread.run_sync(failing_requests, endpoint)
    assert codes == ["INTERNAL"] * 4
