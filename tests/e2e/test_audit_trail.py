"""The audit trail, read where operators read it: the systemd journal's native protocol.

A datagram socket bound by the test stands for journald (``audit_journal_socket``); the
test parses what arrives as journald would (``KEY=value`` lines, or a key, a 64-bit
little-endian length and the bytes) and checks who, what, the decision, the answer and
the result of real calls through a real daemon.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, start_daemon
from toold_client import APPROVE_ALL, CallSpec, Client, Decision

SECRET = "sk-live-0123456789abcdefghijklmnopqrstuvwxyz"
ALL_KINDS = {"batch", "decision", "answer", "result", "refusal"}


def parse_native(datagram: bytes) -> dict[str, str]:
    """One journal entry in the native protocol, as journald reads it."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line_end = rest.index(b"\n")
        line = rest[:line_end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            rest = rest[line_end + 1 :]
        else:  # KEY\n, length, bytes, \n
            key = line
            (size,) = struct.unpack("<Q", rest[line_end + 1 : line_end + 9])
            value = rest[line_end + 9 : line_end + 9 + size]
            assert rest[line_end + 9 + size : line_end + 10 + size] == b"\n"
            rest = rest[line_end + 10 + size :]
        assert key.isupper() or key.replace(b"_", b"").isalnum(), key
        fields[key.decode()] = value.decode()
    return fields


class FakeJournal:
    """A bound datagram socket where journald's would be; ``records`` parses what came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.received: list[dict[str, str]] = []

    def drain(self, settle: float = 0.3) -> list[dict[str, str]]:
        """Everything sent so far (waits until nothing new came for ``settle`` seconds)."""
        self.sock.settimeout(settle)
        while True:
            try:
                self.received.append(parse_native(self.sock.recv(1 << 20)))
            except TimeoutError:
                return self.received

    def of_batch(self, batch_id: str) -> list[dict[str, str]]:
        return [r for r in self.drain() if r.get("TOOLD_BATCH") == batch_id]


@pytest.fixture
def journaled(tmp_path: Path) -> Iterator[tuple[DaemonProcess, FakeJournal, Path]]:
    journal = FakeJournal(tmp_path / "journal.sock")
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("hello\n")
    config = f"""
[daemon]
audit = "journal"
audit_journal_socket = "{journal.path}"

[tools]
max_tool_calls_per_batch = 256

[tools.network]
mode = "none"

[[tools.approval.rules]]
tool = "delete_file"
decision = "deny"
message = "nothing is deleted here"
"""
    d = start_daemon(tmp_path, root, config=config)
    try:
        yield d, journal, root
    finally:
        d.stop()
        journal.sock.close()


def test_every_kind_of_record_names_who_what_and_how_it_ended(
    journaled: tuple[DaemonProcess, FakeJournal, Path],
) -> None:
    d, journal, _root = journaled
    with Client(d.endpoint, client_name="audit-test") as c:
        c.hello()
        read = c.submit([CallSpec("read_file", {"path": "notes.txt"}, "r")])
        denied = c.submit([CallSpec("delete_file", {"path": "notes.txt"}, "d")])
        outside = c.submit([CallSpec("read_file", {"path": "../../etc/shadow"}, "o")])
        asked = c.submit(
            [
                CallSpec(
                    "shell", {"command": f"curl -H 'Authorization: Bearer {SECRET}' http://example.com; echo done"}, "s"
                )
            ],
            on_confirm=lambda request: APPROVE_ALL,
        )
    me = str(os.getuid())

    records = journal.of_batch(read.batch_id)
    assert [r["TOOLD_EVENT"] for r in records] == ["batch", "decision", "result"]
    batch, decision, result = records
    assert batch["TOOLD_UID"] == me and batch["TOOLD_PID"] == str(os.getpid())
    assert batch["TOOLD_CLIENT"] == "audit-test" and batch["TOOLD_CALLS"] == "1"
    assert batch["SYSLOG_IDENTIFIER"] == "toold" and batch["PRIORITY"] == "6"
    assert decision["TOOLD_TOOL"] == "read_file" and decision["TOOLD_DECISION"] == "allow"
    assert decision["TOOLD_SUMMARY"] == "Read notes.txt"
    assert result["TOOLD_RESULT"] == "ok" and float(result["TOOLD_DURATION_MS"]) >= 0
    assert result["TOOLD_BYTES"] == str(len("hello\n"))
    assert len({r["MESSAGE_ID"] for r in records}) == 3  # one id per kind of record

    records = journal.of_batch(denied.batch_id)
    decision = next(r for r in records if r["TOOLD_EVENT"] == "decision")
    assert decision["TOOLD_DECISION"] == "deny" and decision["TOOLD_RULE"] == "0"
    assert "nothing is deleted here" in decision["TOOLD_REASON"]
    result = next(r for r in records if r["TOOLD_EVENT"] == "result")
    assert result["TOOLD_RESULT"] == "error" and result["TOOLD_ERROR_TYPE"] == "Denied"

    records = journal.of_batch(outside.batch_id)
    assert {r["TOOLD_EVENT"] for r in records} == {"batch", "decision", "result", "refusal"}
    refusal = next(r for r in records if r["TOOLD_EVENT"] == "refusal")
    assert refusal["TOOLD_LAYER"] == "paths" and refusal["PRIORITY"] == "4"
    assert next(r for r in records if r["TOOLD_EVENT"] == "decision")["TOOLD_DECISION"] == "invalid"

    records = journal.of_batch(asked.batch_id)
    assert [r["TOOLD_EVENT"] for r in records] == ["batch", "decision", "answer", "result"]
    assert records[1]["TOOLD_DECISION"] == "ask"
    assert records[2]["TOOLD_DECISION"] == "approved" and records[2]["TOOLD_ANSWERED_BY"] == me
    every_byte = b"".join(str(r).encode() for r in journal.received)
    assert SECRET.encode() not in every_byte  # summaries and messages hide credentials
    assert {r["TOOLD_EVENT"] for r in journal.received} == ALL_KINDS


def test_a_denied_answer_and_a_cancelled_batch_are_recorded(journaled: tuple[DaemonProcess, FakeJournal, Path]) -> None:
    d, journal, _root = journaled
    with Client(d.endpoint) as c:
        refused = c.submit(
            [CallSpec("shell", {"command": "echo never"}, "w")],
            on_confirm=lambda request: Decision("deny_all", reason="not today"),
        )
        assert refused.results[0].error is not None
    answer = next(r for r in journal.of_batch(refused.batch_id) if r["TOOLD_EVENT"] == "answer")
    assert answer["TOOLD_DECISION"] == "denied"
    assert answer["TOOLD_ANSWERED_BY"] == str(os.getuid())
    result = next(r for r in journal.of_batch(refused.batch_id) if r["TOOLD_EVENT"] == "result")
    assert result["TOOLD_ERROR_TYPE"] == "Denied"


def test_a_journal_that_stops_reading_never_stalls_the_daemon_and_loses_nothing(
    journaled: tuple[DaemonProcess, FakeJournal, Path],
) -> None:
    """A datagram socket takes a few hundred records before the sender would block: the
    daemon queues the rest and sends them, in order, once the journal reads again."""
    d, journal, _root = journaled
    calls = [CallSpec("read_file", {"path": "notes.txt"}, f"c{i}") for i in range(256)]
    with Client(d.endpoint) as c:
        started = time.monotonic()
        outcomes = [c.submit(calls) for _ in range(2)]  # 1,026 records, none read yet
        elapsed = time.monotonic() - started
        assert all(r.ok for outcome in outcomes for r in outcome.results)
        assert c.ping(timeout=2) < 1.0  # still serving while the journal reads nothing
        assert elapsed < 20
        for outcome in outcomes:
            records = journal.of_batch(outcome.batch_id)
            assert [r["TOOLD_EVENT"] for r in records] == ["batch"] + ["decision"] * 256 + ["result"] * 256
            assert [r["TOOLD_CALL"] for r in records if r["TOOLD_EVENT"] == "result"] == [f"c{i}" for i in range(256)]
        assert c.stats().holding["audit_records_dropped"] == 0


def test_without_a_journal_records_are_key_value_lines_on_stderr(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("x")
    d = start_daemon(tmp_path, root, config='[daemon]\naudit = "auto"\naudit_journal_socket = "/nonexistent/sock"\n')
    try:
        with Client(d.endpoint) as c:
            outcome = c.submit(
                [CallSpec("read_file", {"path": "a.txt"}, "r"), CallSpec("read_file", {"path": "missing"}, "m")]
            )
    finally:
        d.stop()
    lines = [line for line in d.log.read_text().splitlines() if line.startswith("audit=")]
    mine = [line for line in lines if f"batch={outcome.batch_id}" in line]
    assert len(mine) == 5, lines  # the batch, two decisions, two results
    assert f"audit=result uid={os.getuid()} " in mine[3]
    assert "tool=read_file" in mine[3] and "result=ok" in mine[3]
    assert "result=error" in mine[4] and "error_code=" in mine[4]
    assert 'summary="Read a.txt"' in mine[3]  # quoted where it has a space


def test_audit_off_writes_nothing(tmp_path: Path) -> None:
    journal = FakeJournal(tmp_path / "journal.sock")
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=f'[daemon]\naudit = "off"\naudit_journal_socket = "{journal.path}"\n')
    try:
        with Client(d.endpoint) as c:
            c.submit([CallSpec("list_directory", {"path": "."}, "r")])
    finally:
        d.stop()
    assert journal.drain() == []
    assert "audit=" not in d.log.read_text()
