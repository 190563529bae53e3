"""``toolctl memory`` and ``toolctl todos``: the memory and todo tools, for people.

They call the daemon's ``memory`` and ``write_todos`` tools like any agent would, so
they read and write the same store, as the caller's uid, under the same policy.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from toold_protocol import sanitize_for_terminal

from ._client import Client, ConfirmHandler

EXIT_OK, EXIT_TOOL_ERROR = 0, 1


def add_parsers(sub: Any) -> None:
    memory = sub.add_parser("memory", help="what agents remember for you: list, get, set, delete")
    memory.add_argument("action", choices=["list", "get", "set", "delete"])
    memory.add_argument("key", nargs="?", default="")
    memory.add_argument("value", nargs="?", default=None)
    memory.add_argument("--workspace-scope", action="store_true", help="this workspace's memory, not your own")
    memory.add_argument("--json", action="store_true")
    todos = sub.add_parser("todos", help="this workspace's todo list")
    todos.add_argument("--json", action="store_true")


def run(client: Client, args: argparse.Namespace, on_confirm: ConfirmHandler) -> int:
    if args.command == "memory":
        arguments: dict[str, Any] = {"action": args.action, "scope": "workspace" if args.workspace_scope else "user"}
        if args.key:
            arguments["key"] = args.key
        if args.value is not None:
            arguments["value"] = args.value
        result = client.call("memory", arguments, on_confirm=on_confirm)
    else:
        result = client.call("write_todos", {"action": "list"}, on_confirm=on_confirm)
    if args.json:
        print(json.dumps({"ok": result.ok, "content": result.content, "data": result.data}, ensure_ascii=False))
    else:
        print(sanitize_for_terminal(result.content))
    return EXIT_OK if result.ok else EXIT_TOOL_ERROR
