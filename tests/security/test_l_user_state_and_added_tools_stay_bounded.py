"""L. What the daemon keeps for a user, and the tools an administrator adds, stay within
their bounds: another local user reaches none of it, and no argument value becomes code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, module_daemon, reachable_daemon
from tests.e2e.test_identity import as_other_user
from toold_client import Client
from toold_protocol import ToolResult


def call(client: Client, name: str, **arguments: Any) -> ToolResult:
    return client.call(name, arguments, timeout=30)


def test_another_uid_sees_nothing_of_roots_memory_or_todos(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path) as d:
        with d.client() as client:
            call(client, "memory", action="set", key="secret", value="root's")
            call(client, "write_todos", action="add", task="root's task")

        def look(client: Client) -> dict[str, Any]:
            got = client.call("memory", {"action": "get", "key": "secret"})
            listing = client.call("memory", {"action": "list"})
            todos = client.call("write_todos", {"action": "list"})
            removed = client.call("write_todos", {"action": "remove", "id": "1"})
            own = client.call("memory", {"action": "set", "key": "secret", "value": "mine"})
            return {
                "get": got.content,
                "list": listing.content,
                "todos": todos.content,
                "removed": removed.error.code if removed.error else "ok",
                "own": own.ok,
            }

        seen = as_other_user(d.endpoint, look)
        assert seen == {
            "get": "not found: secret",
            "list": "no keys stored",
            "todos": "no todos",
            "removed": "UNKNOWN_TODO",
            "own": True,
        }, seen
        with d.client() as client:
            assert call(client, "memory", action="get", key="secret").content == "root's"
            assert call(client, "write_todos", action="list").content == "[ ] 1: root's task"


COMMANDS = """
[[tools.commands]]
name = "count"
description = "Count the words of a file"
argv = ["wc", "-w", "{file}"]
risk = "low"
side_effecting = false
parameters = { type = "object", properties = { file = { type = "string" } }, required = ["file"] }
"""


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "added-tools", COMMANDS) as d:
        (d.root / "words.txt").write_text("one two\n")
        yield d


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("words.txt\0--files0-from=/etc/passwd", "BadArgs"),  # a NUL would cut the word short
        ("--files0-from=/etc/passwd", "BadArgs"),  # read as an option
        ("-", "BadArgs"),  # stdin, an option-like word too
        ("words.txt; touch pwned", "ExecutionFailed"),  # just a file name wc cannot find
        ("$(touch pwned)", "ExecutionFailed"),
    ],
)
def test_a_command_tool_value_never_becomes_code_or_an_option(commands: DaemonProcess, value: str, kind: str) -> None:
    with commands.client() as client:
        result = client.call("count", {"file": value})
    assert result.error is not None and result.error.type == kind, result.content
    assert "root:" not in result.content and not (commands.root / "pwned").exists()
