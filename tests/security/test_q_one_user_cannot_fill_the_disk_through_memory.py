"""Q. One user cannot fill the disk through memory or todos. The limits per scope (keys,
todos per list) never bounded a user: every workspace is a scope of its own, and a user
may open as many as they have directories (10,000 keys of 64 KB each, per workspace, by
default). The file is shared by every user, and a full disk fails everyone's calls. Now
each user's memory bytes and todos are bounded in all scopes together."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, daemon_rooted_in
from tests.e2e.test_identity import as_other_user
from toold_client import Client

VALUE = "v" * 16_384
BUDGET = 256 * 1024
CONFIG = f"""
[tools.sandbox]
allowed_roots = ["{{shared}}"]

[tools.memory]
max_value_bytes = 16384
max_keys = 1000
max_bytes_per_user = {BUDGET}

[tools.todos]
max_todos = 20
max_todos_per_user = 50
"""


@pytest.fixture
def daemon(tmp_path: Path, shared: Path) -> Iterator[DaemonProcess]:
    with daemon_rooted_in(shared, tmp_path, CONFIG.format(shared=shared)) as d:
        yield d


def test_many_workspaces_do_not_multiply_what_one_user_may_keep(
    daemon: DaemonProcess, shared: Path, tmp_path: Path
) -> None:
    stored, todos = 0, 0
    refusals: set[bool] = set()
    for n in range(12):  # 12 workspaces x 40 keys x 16 KB: 7.9 MB tried, 196 MB allowed per scope limits
        workspace = shared / f"project-{n}"
        workspace.mkdir()
        with Client(daemon.endpoint, timeout=30, workspace=workspace) as client:
            for k in range(40):
                result = client.call("memory", {"action": "set", "key": f"k{k}", "value": VALUE, "scope": "workspace"})
                if result.ok:
                    stored += 1
                else:
                    assert result.error is not None and result.error.code == "LIMITS_EXCEEDED", result.content
                    refusals.add("max_bytes_per_user" in result.error.message)
            for _ in range(20):
                todos += client.call("write_todos", {"action": "add", "task": "fill"}).ok
    assert 0 < stored * len(VALUE) <= BUDGET, stored
    assert refusals == {True}  # every refusal names the budget, none the per-scope limits
    assert todos == 50
    kept = sqlite3.connect(tmp_path / "state" / "memory.sqlite3")
    kept.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # what the log holds, into the file
    kept.close()
    on_disk = sum(p.stat().st_size for p in (tmp_path / "state").glob("memory.sqlite3*"))
    assert on_disk < 2 * BUDGET, on_disk  # not the 7.9 MB tried

    # The budget is this user's: another uid stores as before.
    def other(client: Client) -> dict[str, Any]:
        result = client.call("memory", {"action": "set", "key": "mine", "value": VALUE})
        return {"ok": result.ok, "content": result.content}

    assert as_other_user(daemon.endpoint, other) == {"ok": True, "content": "stored mine"}
    # What was refused frees nothing and breaks nothing: a key deleted makes room again.
    with Client(daemon.endpoint, timeout=30, workspace=shared / "project-0") as client:
        assert client.call("memory", {"action": "delete", "key": "k0", "scope": "workspace"}).ok
        assert client.call("memory", {"action": "set", "key": "again", "value": VALUE, "scope": "workspace"}).ok
        full = client.call("memory", {"action": "set", "key": "more", "value": VALUE, "scope": "workspace"})
        assert full.error is not None and "max_bytes_per_user" in full.error.message
