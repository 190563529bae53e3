"""Q. One user cannot hold every tool worker. Python tools (reads, searches, edits) run
in a bounded pool of workers shared by all users; a call that finds none free waits.
A user whose calls are slow, on purpose or not (here a search whose regex backtracks
until its timeout: overlapping alternation, which the pattern guard lets through, behind
a look-ahead that sends it to Python's engine), could take every worker and leave every
other user's reads waiting for as long as they kept it up. One uid's calls now hold at
most ``max_workers_per_uid`` workers; the rest stay free for the others."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import reachable_daemon
from tests.e2e.test_identity import as_other_user
from toold_client import Client
from toold_protocol import ToolResult

CONFIG = """
[tools.isolation]
max_workers = 2

[tools.timeouts]
default_seconds = 8
file_operations_seconds = 8
"""
BACKTRACKS = "(?=a)(a|aa)+$"  # on 40 a's and a b: about a minute of Python's re


def test_one_users_slow_calls_leave_a_worker_for_everyone_else(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path, config=CONFIG) as daemon:
        (daemon.root / "evil.txt").write_text("a" * 40 + "b\n")
        (daemon.root / "notes.txt").write_text("another user's notes\n")
        (daemon.root / "notes.txt").chmod(0o644)
        results: list[ToolResult] = []

        def attack() -> None:
            with Client(daemon.endpoint, timeout=60) as client:
                results.append(client.call("grep", {"pattern": BACKTRACKS, "path": "evil.txt"}))

        attackers = [threading.Thread(target=attack) for _ in range(2)]  # as many as the pool holds
        for attacker in attackers:
            attacker.start()
        time.sleep(1.5)  # both submitted; the first (at least) is backtracking in a worker

        def read(client: Client) -> dict[str, Any]:
            started = time.monotonic()
            result = client.call("read_file", {"path": "notes.txt"})
            return {"ok": result.ok, "content": result.content, "seconds": time.monotonic() - started}

        seen = as_other_user(daemon.endpoint, read)
        for attacker in attackers:
            attacker.join(timeout=60)
        assert seen["ok"] and "another user's notes" in seen["content"], seen
        # Before the bound, the read waited for one of the attacker's calls to time out (~7 s).
        assert seen["seconds"] < 4.0, seen
        assert len(results) == 2 and not any(r.ok for r in results)  # the attack itself got nowhere
        assert all(r.error is not None and r.error.type == "Timeout" for r in results), [r.content for r in results]
