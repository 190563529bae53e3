"""Q. One user cannot hold every tool worker or every MCP server instance. Both are
bounded pools shared by all users: a call that finds no worker free waits, one that finds
every instance busy is refused. A user whose calls are slow, on purpose or not (a search
whose regex backtracks until its timeout: overlapping alternation, which the pattern
guard lets through, behind a look-ahead that sends it to Python's engine; a server's
tool that sleeps, in as many workspaces as the pool has instances), could take a whole
pool and leave every other user's calls waiting, or refused, for as long as they kept it
up. One uid now holds at most ``max_workers_per_uid`` workers and
``max_instances_per_uid`` instances; the rest stay for the others."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import daemon_rooted_in, reachable_daemon
from tests.e2e.test_identity import as_other_user
from tests.e2e.test_mcp_gateway import hostile_entry
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


def test_one_users_busy_servers_leave_an_instance_for_everyone_else(tmp_path: Path, shared: Path) -> None:
    config = f"""
[tools.approval]
mode = "auto"

[tools.sandbox]
allowed_roots = ["{shared}"]

[mcp]
max_instances = 2

{hostile_entry("hostile")}
"""
    with daemon_rooted_in(shared, tmp_path, config) as daemon:
        results: list[ToolResult] = []

        def attack(n: int) -> None:  # each workspace has an instance of its own
            workspace = shared / f"attacker-{n}"
            workspace.mkdir()
            with Client(daemon.endpoint, timeout=60, workspace=workspace) as client:
                results.append(client.call("mcp__hostile__sleep", {"seconds": 8}))

        attackers = [threading.Thread(target=attack, args=(n,)) for n in range(2)]
        for attacker in attackers:
            attacker.start()
        time.sleep(3.0)  # the instances started and are sleeping in their calls

        def whoami(client: Client) -> dict[str, Any]:
            result = client.call("mcp__hostile__whoami", {})
            return {"ok": result.ok, "content": result.content}

        seen = as_other_user(daemon.endpoint, whoami)
        for attacker in attackers:
            attacker.join(timeout=60)
        # Before the bound: "2 MCP server instances are busy ([mcp] max_instances)".
        assert seen["ok"], seen
        refused = [r for r in results if not r.ok]
        assert len(results) == 2 and len(refused) == 1, [r.content for r in results]
        # Refused at its instance, or at the listing of its workspace's tools (which needs
        # an instance too): either way it says why, and that it is this user's share.
        assert refused[0].error is not None and refused[0].error.code == "LIMITS_EXCEEDED", refused[0].content
        assert "max_instances_per_uid" in refused[0].error.message
