"""A journal whose writer thread stops at each commit until the test opens a gate: a disk
that stopped answering, on a real SQLite file; and a daemon served in the test's own
process (real socket, real journal, the in-process runner) whose journal is so held."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio

from toold_daemon.config import Config
from toold_daemon.records.journal_writer import Commit, JournalWriter
from toold_daemon.server import ServeOptions, serve
from toold_daemon.service import running


def hold_back_journal_writer(monkeypatch: pytest.MonkeyPatch, seconds: float = 20.0) -> threading.Event:
    """Make the writer thread wait at each commit (at most ``seconds``) until the
    returned gate is set; the test sets it when the disk should answer again."""
    gate = threading.Event()
    commit_group = JournalWriter._commit

    def held_back(self: JournalWriter, group: list[tuple[object, Commit]]) -> None:
        gate.wait(seconds)
        commit_group(self, group)  # type: ignore[arg-type]

    monkeypatch.setattr(JournalWriter, "_commit", held_back)
    return gate


@asynccontextmanager
async def daemon_with_a_journal_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, every_read_waits: bool = True, **limits: int
) -> AsyncIterator[tuple[str, threading.Event]]:
    """(endpoint, gate): a daemon serving ``tmp_path/root`` (holding ``a.txt``) whose every
    ended read waits for its journal record (``every_read_waits``; else only past the
    service's backlog bounds), which waits for the gate. ``limits``: ``[daemon]`` settings."""
    gate = hold_back_journal_writer(monkeypatch)
    # as if the thread were busy: the loop never commits a write itself
    monkeypatch.setattr(JournalWriter, "_now_if_idle", lambda self, write, size=0, owed=False: None)
    if every_read_waits:
        monkeypatch.setattr(running, "JOURNAL_BACKLOG", -1)
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    base = Config()
    config = msgspec.structs.replace(base, daemon=msgspec.structs.replace(base.daemon, **limits))
    (tmp_path / "state").mkdir(mode=0o700)
    endpoint = f"ipc://{tmp_path}/d.sock"
    options = ServeOptions(roots=[root], endpoint=endpoint, state_dir=tmp_path / "state")
    try:
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            nursery.start_soon(lambda: serve(config, options, ready=lambda _endpoint: ready.set()))
            await ready.wait()
            yield endpoint, gate
            nursery.cancel_scope.cancel()
    finally:
        gate.set()
