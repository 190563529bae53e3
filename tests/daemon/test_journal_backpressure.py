"""A journal that falls behind slows the clients whose batches wait for it; it never
makes them fail. A daemon served in this process (real socket, real journal file, the
in-process runner) with a journal writer held back by the test."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import trio

from tests.held_journal import hold_back_journal_writer
from toold_client import Client
from toold_daemon.config import Config
from toold_daemon.records.journal_writer import JournalWriter
from toold_daemon.server import ServeOptions, serve
from toold_daemon.service import running

pytestmark = pytest.mark.trio


async def test_sequential_calls_wait_for_a_journal_behind_instead_of_being_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends one call after another, each answered: while the journal is
    behind, each ended batch keeps its slot until its record is written. The next call
    waits for that (before, past the per-uid limit of running batches, it was refused
    with TOO_MANY_BATCHES: a busy journal failed well-behaved clients)."""
    gate = hold_back_journal_writer(monkeypatch)
    monkeypatch.setattr(JournalWriter, "_now_if_idle", lambda self, write: None)  # as if the thread were busy
    monkeypatch.setattr(running, "JOURNAL_BACKLOG", -1)  # every ended batch waits for its record
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    base = Config()
    config = msgspec.structs.replace(
        base, daemon=msgspec.structs.replace(base.daemon, max_running_batches_per_uid=2, max_batches_per_session=2)
    )
    (tmp_path / "state").mkdir(mode=0o700)
    endpoint = f"ipc://{tmp_path}/d.sock"
    options = ServeOptions(roots=[root], endpoint=endpoint, state_dir=tmp_path / "state")

    def five_calls() -> tuple[list[bool], float]:
        started = time.monotonic()
        with Client(endpoint, timeout=30) as client:
            oks = [client.call("read_file", {"path": "a.txt"}).ok for _ in range(5)]
        return oks, time.monotonic() - started

    async with trio.open_nursery() as nursery:
        ready = trio.Event()
        nursery.start_soon(lambda: serve(config, options, ready=lambda _endpoint: ready.set()))
        await ready.wait()

        async def open_the_journal_later() -> None:
            await trio.sleep(0.5)
            gate.set()

        nursery.start_soon(open_the_journal_later)
        oks, took = await trio.to_thread.run_sync(five_calls)
        assert oks == [True] * 5
        assert took >= 0.4  # the second call waited for the first one's record
        nursery.cancel_scope.cancel()
    gate.set()
