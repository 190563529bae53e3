from __future__ import annotations

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
