"""``toolctl mcp``'s entry: the bridge served over stdio with the line of the MCP SDK
that is installed (``_mcp_v1`` or ``_mcp_v2``)."""

from __future__ import annotations

import os
import sys

import anyio

from .mcp_bridge import Bridge, sdk_line


def main(endpoint: str | None, workspace: str | None, approval_timeout: float | None) -> int:
    bridge = Bridge(endpoint, os.path.abspath(workspace) if workspace else None, approval_timeout)
    if sdk_line() >= 2:
        from . import _mcp_v2 as served
    else:
        from . import _mcp_v1 as served  # type: ignore[no-redef]
    try:
        anyio.run(served.serve_stdio, bridge)
    finally:
        bridge.close()
    print("toolctl mcp: the MCP client closed the session", file=sys.stderr)
    return 0
