"""Network connections through the egress proxy, as lines for people: a command's
(``data.network`` of its result) and an MCP server's (``list_connections``)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import msgspec

from toold_protocol import ServerConnection, ToolResult


def connection_lines(result: ToolResult | None) -> list[str]:
    """A command's network connections through the egress proxy, one line each."""
    records = (result.data or {}).get("network") if result is not None else None
    lines = []
    for record in records if isinstance(records, list) else []:
        if isinstance(record, dict):
            lines.append(f"-> {_connection(record)}")
    omitted = (result.data or {}).get("network_omitted") if result is not None else None
    if isinstance(omitted, dict) and omitted.get("connections"):
        lines.append(
            f"-> and {omitted.get('connections')} more connection(s) not listed ({omitted.get('refused', 0)} refused); "
            f"sent {omitted.get('sent', 0)} B, received {omitted.get('received', 0)} B"
        )
    return lines


def server_connection_line(connection: ServerConnection) -> str:
    """One connection of an MCP server: when it ended, the server and its uid, then as a
    command's connection reads."""
    ended = datetime.datetime.fromtimestamp(connection.ended, tz=datetime.UTC).isoformat(timespec="seconds")
    record = msgspec.structs.asdict(connection)
    return f"{ended} {connection.server} (uid {connection.uid}) -> {_connection(record)}"


def _connection(record: Mapping[str, Any]) -> str:
    where = f"{record.get('host')}:{record.get('port')} ({record.get('protocol')})"
    verdict = f"refused: {record['refused']}" if record.get("refused") else f"allowed: {record.get('allowed_by')}"
    return f"{where} {verdict}; sent {record.get('sent', 0)} B, received {record.get('received', 0)} B"
