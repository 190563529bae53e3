"""A command's network connections (``data.network`` of its result), as lines for people."""

from __future__ import annotations

from toold_protocol import ToolResult


def connection_lines(result: ToolResult | None) -> list[str]:
    """A command's network connections through the egress proxy, one line each."""
    records = (result.data or {}).get("network") if result is not None else None
    lines = []
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        where = f"{record.get('host')}:{record.get('port')} ({record.get('protocol')})"
        verdict = f"refused: {record['refused']}" if record.get("refused") else f"allowed: {record.get('allowed_by')}"
        lines.append(f"-> {where} {verdict}; sent {record.get('sent', 0)} B, received {record.get('received', 0)} B")
    omitted = (result.data or {}).get("network_omitted") if result is not None else None
    if isinstance(omitted, dict) and omitted.get("connections"):
        lines.append(
            f"-> and {omitted.get('connections')} more connection(s) not listed ({omitted.get('refused', 0)} refused); "
            f"sent {omitted.get('sent', 0)} B, received {omitted.get('received', 0)} B"
        )
    return lines
