"""A listing refused for want of room (the caller's share of MCP server instances, or
the whole pool, busy) is the caller's, not the server's: it does not mark the server as
failed, which would leave its tools unlisted for every user until a retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import msgspec
import pytest

from toold_daemon.config import Config, McpConfig, McpServerConfig
from toold_daemon.errors import ToolError
from toold_daemon.mcp.gateway import Gateway
from toold_daemon.policy.planner import Planner
from toold_daemon.sandbox import build_sandbox
from toold_daemon.tools.registry import Registry
from toold_protocol import Identity, ToolCall, ToolErrorType

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


async def test_a_call_whose_servers_tools_could_not_be_listed_for_its_user_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    registry = Registry()
    gateway = Gateway(McpConfig(servers=[SERVER]), runner=None, registry=registry)  # type: ignore[arg-type]
    monkeypatch.setattr(gateway, "_instance", refusing("LIMITS_EXCEEDED"))
    await gateway.discover(Identity(uid=1000, gid=1000, pid=1), sandbox=None)  # type: ignore[arg-type]
    call = ToolCall(call_id="c", name="mcp__srv__anything", arguments=msgspec.Raw(b"{}"))
    sandbox = build_sandbox(Config(), [str(tmp_path)])

    def error_of(uid: int) -> str:
        planner = Planner(registry, sandbox, Config(), Identity(uid=uid, gid=uid, pid=1), "test", frozenset())
        (item,) = planner.plan([call])
        assert item.result is not None and item.result.error is not None
        return item.result.error.code

    assert error_of(1000) == "LIMITS_EXCEEDED"  # this user's: why, not "unknown"
    assert error_of(1001) == "UNKNOWN_TOOL"  # another user's calls know nothing of it
    registry.forget_unlisted("mcp__srv__")  # a listing that succeeds forgets it
    assert error_of(1000) == "UNKNOWN_TOOL"
