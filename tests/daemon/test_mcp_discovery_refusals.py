"""A listing refused for want of room (the caller's share of MCP server instances, or
the whole pool, busy) is the caller's, not the server's: it does not mark the server as
failed, which would leave its tools unlisted for every user until a retry."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest

from toold_daemon.config import McpConfig, McpServerConfig
from toold_daemon.errors import ToolError
from toold_daemon.mcp.gateway import Gateway
from toold_daemon.tools.registry import Registry
from toold_protocol import Identity, ToolErrorType

SERVER = McpServerConfig(name="srv", command="/bin/true")


def refusing(code: str) -> Any:
    async def instance(*_: object) -> NoReturn:
        raise ToolError(ToolErrorType.SANDBOX_VIOLATION, code, f"refused: {code}")

    return instance


@pytest.mark.parametrize(("code", "server_failed"), [("LIMITS_EXCEEDED", False), ("MCP_SERVER_FAILED", True)])
async def test_only_the_servers_own_failures_hold_its_listing_back(
    code: str, server_failed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = Gateway(McpConfig(servers=[SERVER]), runner=None, registry=Registry())  # type: ignore[arg-type]
    monkeypatch.setattr(gateway, "_instance", refusing(code))
    await gateway.discover(Identity(uid=1000, gid=1000, pid=1), sandbox=None)  # type: ignore[arg-type]
    assert gateway.needs_discovery(None) is not server_failed  # due again at once, or after the retry delay
    assert bool(gateway.problems.get("srv")) is server_failed
