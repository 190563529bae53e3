"""``toolctl stats``: what the daemon has done since it started, for people.

Calls by tool, policy decision and outcome; latency percentiles of the most recent
calls; batches by state; what the daemon holds now. ``--json`` gives the daemon's
answer as it is.
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

import msgspec

from toold_protocol import Stats, sanitize_for_terminal

from ._client import Client


def add_parser(sub: Any) -> None:
    stats = sub.add_parser("stats", help="calls by tool, decision and outcome; latency; what the daemon holds now")
    stats.add_argument("--json", action="store_true")


def run(client: Client, args: argparse.Namespace) -> int:
    stats = client.stats()
    if args.json:
        print(json.dumps(msgspec.to_builtins(stats), indent=2, ensure_ascii=False))
    else:
        print("\n".join(render(stats)))
    return 0


def render(stats: Stats) -> list[str]:
    since = datetime.datetime.fromtimestamp(stats.since).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
    whose = "every user's" if stats.scope == "all" else "your"
    lines = [f"since {since} ({whose} calls)", ""]
    if stats.calls:
        rows: list[tuple[str, ...]] = [("TOOL", "DECISION", "OUTCOME", "CALLS")]
        rows += [(c.tool, c.decision, c.outcome, str(c.count)) for c in stats.calls]
        lines += _table(rows, numeric={3})
    else:
        lines.append("no calls yet")
    if stats.latency:
        lines.append("")
        rows = [("LATENCY (ms)", "CALLS", "P50", "P90", "P99", "MAX")]
        rows += [
            (
                "all tools" if lat.tool == "*" else lat.tool,
                str(lat.count),
                f"{lat.p50_ms:.1f}",
                f"{lat.p90_ms:.1f}",
                f"{lat.p99_ms:.1f}",
                f"{lat.max_ms:.1f}",
            )
            for lat in stats.latency
        ]
        lines += _table(rows, numeric={1, 2, 3, 4, 5})
    if stats.batches:
        lines += ["", "batches: " + ", ".join(f"{state} {count}" for state, count in stats.batches.items())]
    holding = stats.holding
    if holding:
        lines += ["", "now: " + ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in holding.items())]
    return [sanitize_for_terminal(line) for line in lines]


def _table(rows: list[tuple[str, ...]], *, numeric: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]
