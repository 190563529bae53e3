from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from toold_daemon.config import DEFAULT_DENIED_PATTERNS, Config
from toold_daemon.sandbox import Sandbox
from toold_daemon.tools import Tool, ToolContext, ToolOutput


@pytest.fixture
def ctx(root: Path) -> ToolContext:
    return make_ctx(root)


def make_ctx(root: Path, config: Config | None = None) -> ToolContext:
    return ToolContext(
        call_id="t", sandbox=Sandbox([root], denied_patterns=DEFAULT_DENIED_PATTERNS), config=config or Config()
    )


def run(tool: Tool[Any], ctx: ToolContext, **arguments: Any) -> ToolOutput:
    """Decode the arguments exactly as the planner does, validate, run."""
    args = msgspec.msgpack.decode(msgspec.msgpack.encode(arguments), type=tool.args_type)
    tool.validate(args)
    return tool.run(args, ctx)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes asked of every ``os.read`` while the test runs (each still made, for real):
    for the tests that count the system calls a read takes."""
    asked: list[int] = []
    real_read = os.read

    def counted(fd: int, n: int) -> bytes:
        asked.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counted)
    return asked
