"""memory and write_todos end to end: real daemons, a real SQLite file, a second uid,
parallel client processes, and toolctl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, DaemonProcess, start_daemon
from toold_client import Client
from toold_client.watch import WatchState
from toold_protocol import CallFinished, ToolResult


def call(client: Client, name: str, **arguments: Any) -> ToolResult:
    return client.call(name, arguments, timeout=30)


def test_memory_round_trip_and_a_missing_key_is_not_an_error(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert call(client, "memory", action="set", key="editor", value="vim, always").ok
        got = call(client, "memory", action="get", key="editor")
        assert (
            got.ok
            and got.content == "vim, always"
            and got.data == {"key": "editor", "value": "vim, always", "found": True}
        )
        missing = call(client, "memory", action="get", key="nothing")
        assert missing.ok and missing.content == "not found: nothing" and missing.data is not None
        assert missing.data["found"] is False
        call(client, "memory", action="set", key="lang", value="python")
        listing = call(client, "memory", action="list")
        assert listing.content == "editor: vim, always\nlang: python"
        assert listing.data == {"keys": ["editor", "lang"]}
        assert call(client, "memory", action="delete", key="lang").content == "deleted lang"
        assert call(client, "memory", action="delete", key="lang").content == "not found: lang"
        assert client.explain("memory", {"action": "set", "key": "a", "value": "b"}).decision == "allow"


def test_bad_memory_calls_and_limits(tmp_path: Path, root: Path) -> None:
    config = "[tools.memory]\nmax_key_chars = 8\nmax_value_bytes = 16\nmax_keys = 2\n"
    d = start_daemon(tmp_path, root, config=config)
    try:
        with d.client() as client:
            for arguments in ({"action": "set", "key": "k"}, {"action": "get"}, {"action": "delete"}):
                result = client.call("memory", arguments)
                assert result.error is not None and result.error.type == "BadArgs", arguments
            long_key = call(client, "memory", action="set", key="k" * 9, value="v")
            assert long_key.error is not None and "max_key_chars" in long_key.error.message
            big = call(client, "memory", action="set", key="k", value="é" * 9)  # 18 bytes
            assert big.error is not None and "max_value_bytes" in big.error.message
            assert call(client, "memory", action="set", key="a", value="1").ok
            assert call(client, "memory", action="set", key="b", value="2").ok
            full = call(client, "memory", action="set", key="c", value="3")
            assert full.error is not None and full.error.code == "LIMITS_EXCEEDED" and "max_keys" in full.error.message
            assert call(client, "memory", action="set", key="a", value="updated").ok  # replacing is not adding
    finally:
        d.stop()


def test_memory_and_todos_survive_a_restart(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root)
    with d.client() as client:
        call(client, "memory", action="set", key="kept", value="across restarts")
        call(client, "memory", action="set", key="here", value="this workspace", scope="workspace")
        call(client, "write_todos", action="add", task="survive")
    d.stop()
    again = start_daemon(tmp_path, root)
    try:
        with again.client() as client:
            assert call(client, "memory", action="get", key="kept").content == "across restarts"
            assert call(client, "memory", action="get", key="here", scope="workspace").content == "this workspace"
            assert call(client, "memory", action="get", key="here").content == "not found: here"  # scopes are apart
            assert call(client, "write_todos", action="list").content == "[ ] 1: survive"
    finally:
        again.stop()


WRITER = """
import sys
from toold_client import Client
with Client(sys.argv[1], timeout=60) as client:
    for n in range(16):
        result = client.call("memory", {"action": "set", "key": f"w{sys.argv[2]}-{n}", "value": str(n)})
        assert result.ok, result.content
"""


def test_eight_parallel_clients_lose_no_write(daemon: DaemonProcess) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, daemon.endpoint, str(w)], stderr=subprocess.PIPE)
        for w in range(8)
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err.decode()
    with daemon.client() as client:
        listing = call(client, "memory", action="list")
    assert listing.data is not None and len(listing.data["keys"]) == 8 * 16


def test_todos_step_by_step(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        first = call(client, "write_todos", action="add", task="write the tests")
        assert first.ok and first.data is not None and first.data["id"] == "1"
        call(client, "write_todos", action="add", task="make them pass")
        done = call(client, "write_todos", action="complete", id="1")
        assert done.content == "[x] 1: write the tests\n[ ] 2: make them pass"
        assert done.data is not None and [t["status"] for t in done.data["todos"]] == ["completed", "pending"]
        assert set(done.data["todos"][0]) == {"id", "task", "status", "created"}
        unknown = call(client, "write_todos", action="complete", id="99")
        assert unknown.error is not None and unknown.error.code == "UNKNOWN_TODO"
        assert call(client, "write_todos", action="remove", id="1").content == "[ ] 2: make them pass"
        third = call(client, "write_todos", action="add", task="ship")
        assert third.data is not None and third.data["id"] == "3"  # ids are never reused
        empty = client.call("write_todos", {"action": "add", "task": "  "})
        assert empty.error is not None and empty.error.type == "BadArgs"


def test_todos_as_a_whole_list(daemon: DaemonProcess) -> None:
    todos = [
        {"task": "read the code", "status": "completed"},
        {"task": "fix the bug", "status": "in_progress"},
        {"task": "write a test"},
        {"task": "old idea", "status": "cancelled"},
    ]
    with daemon.client() as client:
        call(client, "write_todos", action="add", task="replaced soon")
        result = call(client, "write_todos", action="replace", todos=todos)
        assert result.content == "[x] 2: read the code\n[~] 3: fix the bug\n[ ] 4: write a test\n[-] 5: old idea"
        two = client.call(
            "write_todos",
            {
                "action": "replace",
                "todos": [{"task": "a", "status": "in_progress"}, {"task": "b", "status": "in_progress"}],
            },
        )
        assert two.error is not None and two.error.type == "BadArgs" and "in_progress" in two.error.message
        bad = client.call("write_todos", {"action": "replace", "todos": [{"task": "a", "status": "done"}]})
        assert bad.error is not None and bad.error.type == "BadArgs"


def test_toolctl_memory_and_todos(daemon: DaemonProcess) -> None:
    def toolctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "toolctl"), "--endpoint", daemon.endpoint, *args], capture_output=True, text=True, timeout=60
        )

    assert toolctl("memory", "set", "colour", "green").returncode == 0
    assert toolctl("memory", "get", "colour").stdout == "green\n"
    listed = json.loads(toolctl("memory", "list", "--json").stdout)
    assert listed["data"] == {"keys": ["colour"]}
    assert toolctl("memory", "delete", "colour").stdout == "deleted colour\n"
    with daemon.client() as client:
        call(client, "write_todos", action="add", task="from an agent")
    assert toolctl("todos").stdout == "[ ] 1: from an agent\n"


def test_watch_shows_the_latest_todo_list() -> None:
    from toold_protocol import BatchStatus, PlannedCall

    state = WatchState()
    planned = PlannedCall(index=0, call_id="c", name="write_todos", summary="Todos: add x", disposition="run")
    state.apply(BatchStatus(id=None, batch_id="b1", state="running", calls=[planned], results=[]))
    data = {"todos": [{"id": "1", "task": "x", "status": "in_progress", "created": 0.0}]}
    state.apply(CallFinished(batch_id="b1", index=0, result=ToolResult(call_id="c", ok=True, content="", data=data)))
    screen = "\n".join(state.render(120, 40))
    assert "todos" in screen and "[~] 1: x" in screen


@pytest.fixture
def daemon(tmp_path: Path, root: Path) -> Any:
    d = start_daemon(tmp_path, root)
    try:
        yield d
    finally:
        d.stop()
