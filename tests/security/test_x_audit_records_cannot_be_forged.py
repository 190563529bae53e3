"""Class X: what a client, the model or a file name puts in an audit record cannot forge
another field or another record.

The client chooses its name, the model chooses paths and commands (which become the
call's summary), and a file name may hold a newline. In the journal's native protocol a
value with a newline is length-framed, so it cannot start a field of its own; as lines,
control characters are escaped, so it cannot start a line of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import start_daemon
from tests.e2e.test_audit_trail import FakeJournal
from toold_client import CallSpec, Client

FORGED_NAME = "agent\nTOOLD_UID=0\nPRIORITY=0\nMESSAGE_ID=00000000000000000000000000000000"
FORGED_PATH = "notes\naudit=result uid=0 tool=shell result=ok\nTOOLD_UID=0.txt"


def run_calls(endpoint: str) -> str:
    with Client(endpoint, client_name=FORGED_NAME) as c:
        c.hello()
        outcome = c.submit([CallSpec("read_file", {"path": FORGED_PATH}, "r")])
    return outcome.batch_id


def test_journal_fields_cannot_be_forged_through_names_or_paths(tmp_path: Path) -> None:
    journal = FakeJournal(tmp_path / "journal.sock")
    root = tmp_path / "root"
    root.mkdir()
    (root / FORGED_PATH).write_text("hi")
    config = f'[daemon]\naudit = "journal"\naudit_journal_socket = "{journal.path}"\n'
    d = start_daemon(tmp_path, root, config=config)
    try:
        batch = run_calls(d.endpoint)
        records = journal.of_batch(batch)
    finally:
        d.stop()
        journal.sock.close()
    assert [r["TOOLD_EVENT"] for r in records] == ["batch", "decision", "result"]
    for record in records:
        assert record["TOOLD_UID"] == str(os.getuid())  # the kernel's, never the name's
        assert record["PRIORITY"] == "6" and record["MESSAGE_ID"] != "0" * 32
    assert records[0]["TOOLD_CLIENT"] == FORGED_NAME  # kept whole, as one framed value
    standard = {"MESSAGE", "MESSAGE_ID", "PRIORITY", "SYSLOG_IDENTIFIER"}
    assert all(key in standard or key.startswith("TOOLD_") for r in records for key in r)  # no field made up
    assert "notes" in records[1]["TOOLD_SUMMARY"] and records[2]["TOOLD_TOOL"] == "read_file"


def test_lines_cannot_be_forged_through_names_or_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / FORGED_PATH).write_text("hi")
    d = start_daemon(tmp_path, root, config='[daemon]\naudit = "lines"\n')
    try:
        batch = run_calls(d.endpoint)
    finally:
        d.stop()
    lines = d.log.read_text().splitlines()
    mine = [line for line in lines if f"batch={batch}" in line]
    assert len(mine) == 3, mine  # one line per record, nothing split off
    audit_lines = [line for line in lines if line.startswith("audit=")]
    assert audit_lines and all(f" uid={os.getuid()} " in line.split(" gid=")[0] + " " for line in audit_lines)
    assert not any(line.startswith("TOOLD_UID") for line in lines)
    assert "\\n" in mine[0]  # the name's newlines, escaped inside the value
