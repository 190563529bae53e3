"""``toolctl journal``: the daemon's journal of batches (list, show, prune) and of the
connections MCP servers made through the egress proxy."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

import msgspec

from toold_protocol import sanitize_for_terminal

from ._client import Client
from ._connections import connection_lines, server_connection_line
from ._result_json import result_json


def add_parser(sub: Any) -> None:
    journal = sub.add_parser("journal", help="the daemon's journal of batches")
    journal_sub = journal.add_subparsers(dest="journal_command", required=True)
    listing = journal_sub.add_parser("list", help="batches, newest first")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--limit", type=int, default=100)
    show = journal_sub.add_parser("show", help="one batch: its calls in order and their results")
    show.add_argument("batch_id")
    show.add_argument("--json", action="store_true")
    connections = journal_sub.add_parser(
        "connections", help="connections MCP servers made through the egress proxy, newest first"
    )
    connections.add_argument("--server", help="only this server's")
    connections.add_argument("--json", action="store_true")
    connections.add_argument("--limit", type=int, default=100)
    prune = journal_sub.add_parser(
        "prune", help="delete finished batches (and servers' connections) older than --older-than"
    )
    prune.add_argument("--older-than", type=float, default=30 * 86400, metavar="SECONDS")


def run(client: Client, args: argparse.Namespace) -> int:
    if args.journal_command == "list":
        batches = client.list_batches(limit=args.limit)
        if args.json:
            print(
                json.dumps(
                    [
                        {
                            "batch_id": b.batch_id,
                            "state": b.state,
                            "submitted": _iso(b.submitted),
                            "calls": b.calls,
                            "uid": b.uid,
                        }
                        for b in batches
                    ]
                )
            )
        else:
            for b in batches:
                print(f"{sanitize_for_terminal(b.batch_id):<32} {b.state:<12} {_iso(b.submitted)}  {b.calls} calls")
        return 0
    if args.journal_command == "show":
        status = client.get_batch(args.batch_id)
        results = {r.call_id: r for r in status.results}
        if args.json:
            print(
                json.dumps(
                    {
                        "batch_id": status.batch_id,
                        "state": status.state,
                        "calls": [
                            {
                                "index": c.index,
                                "call_id": c.call_id,
                                "name": c.name,
                                "summary": c.summary,
                                "result": result_json(results[c.call_id]) if c.call_id in results else None,
                            }
                            for c in status.calls
                        ],
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print(f"batch {sanitize_for_terminal(status.batch_id)}: {status.state}")
            for c in status.calls:
                r = results.get(c.call_id)
                state = "pending" if r is None else ("ok" if r.ok else f"error {r.error.code if r.error else ''}")
                print(f"  {c.index:>3} {sanitize_for_terminal(c.call_id):<20} {c.name:<16} {state}")
                for line in connection_lines(r):
                    print(f"        {sanitize_for_terminal(line)}")
        return 0
    if args.journal_command == "connections":
        return _server_connections(client, args)
    removed = client.prune(args.older_than)
    print(f"pruned {removed} batches")
    return 0


def _server_connections(client: Client, args: argparse.Namespace) -> int:
    connections = client.list_connections(args.server, limit=args.limit)
    if args.json:
        print(json.dumps([msgspec.to_builtins(c) for c in connections], ensure_ascii=False))
    else:
        for connection in connections:
            print(sanitize_for_terminal(server_connection_line(connection)))
    return 0


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="seconds")
