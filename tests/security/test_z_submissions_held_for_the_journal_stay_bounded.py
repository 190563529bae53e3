"""Class Z: while the journal is behind, a session's next submissions wait for it instead
of failing. A client must not turn that waiting into unbounded work held by the daemon.

A daemon served in this process, its journal writer held back by the test
(``tests.held_journal``); the attacker is one session firing submissions without waiting
for any answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.held_journal import daemon_with_a_journal_behind
from toold_client import AsyncClient, Client, RemoteError

pytestmark = pytest.mark.trio

HELD_PER_SESSION = 4
FIRED = 40


async def test_a_session_cannot_pile_up_submissions_behind_a_slow_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 submissions at once from one session, the journal held: those past what a
    session may run are refused with TOO_MANY_BATCHES (not kept), the ones held run once
    the journal answers, and another client is served meanwhile."""
    limits = {"max_batches_per_session": HELD_PER_SESSION, "max_running_batches_per_uid": 64}
    async with daemon_with_a_journal_behind(tmp_path, monkeypatch, **limits) as (endpoint, gate):
        outcomes: list[str] = []
        async with AsyncClient(endpoint, timeout=30) as attacker:
            first = await attacker.call("read_file", {"path": "a.txt"})  # its record now waits
            assert first.ok

            async def fire() -> None:
                try:
                    result = await attacker.call("read_file", {"path": "a.txt"})
                    outcomes.append("ok" if result.ok else "error")
                except RemoteError as exc:
                    outcomes.append(exc.code)

            async with trio.open_nursery() as nursery:
                for _ in range(FIRED):
                    nursery.start_soon(fire)
                with trio.fail_after(10):
                    while outcomes.count("TOO_MANY_BATCHES") < FIRED - HELD_PER_SESSION:
                        await trio.sleep(0.01)  # the refusals come while the rest are held
                other = await trio.to_thread.run_sync(_another_client_reads, endpoint)
                assert other  # the daemon serves everyone else meanwhile
                gate.set()  # the disk answers: the held submissions run
    assert outcomes.count("TOO_MANY_BATCHES") == FIRED - HELD_PER_SESSION
    assert outcomes.count("ok") == HELD_PER_SESSION


def _another_client_reads(endpoint: str) -> bool:
    """Another session's call, answered while the journal is held (its record waits too)."""
    with Client(endpoint, timeout=10) as client:
        return client.call("read_file", {"path": "a.txt"}).ok


async def test_clients_that_each_open_a_session_cannot_pile_up_batches_behind_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's batch waiting for the journal holds that session's next submissions;
    a client that opens a new session for each submission (a new connection, or one cut
    off for not reading) would escape that and pile up results waiting for the disk. The
    uid's waiting batches are counted whatever became of their sessions: past
    ``max_running_batches_per_uid`` its submissions are refused."""
    limits = {"max_running_batches_per_uid": 4}
    async with daemon_with_a_journal_behind(tmp_path, monkeypatch, **limits) as (endpoint, gate):
        outcomes = await trio.to_thread.run_sync(_a_session_per_read, endpoint, 12)
        gate.set()
    assert outcomes[:4] == ["ok"] * 4
    assert outcomes[4:] == ["TOO_MANY_BATCHES"] * 8


def _a_session_per_read(endpoint: str, count: int) -> list[str]:
    outcomes = []
    for _ in range(count):
        with Client(endpoint, timeout=10) as client:
            try:
                outcomes.append("ok" if client.call("read_file", {"path": "a.txt"}).ok else "error")
            except RemoteError as exc:
                outcomes.append(exc.code)
    return outcomes
