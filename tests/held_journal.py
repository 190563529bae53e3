"""A journal whose writer thread stops at each commit until the test opens a gate: a disk
that stopped answering, on a real SQLite file."""

from __future__ import annotations

import threading

import pytest

from toold_daemon.records.journal_writer import Commit, JournalWriter


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
