"""A start makes the tools' planning imports (``Tool.warm_planning``: web_fetch's HTTP
stack, about 36 ms) on a thread of its own, once it has served a moment: that thread
holds the interpreter lock the event loop needs, and a start's first clients come in its
first milliseconds (a start's first read came 9 ms later when both began together)."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest

from tests.daemon.test_registry import EchoArgs
from toold_daemon.server import WARM_PLANNING_AFTER_SECONDS, warm_planning_soon
from toold_daemon.tools import Tool, ToolContext, ToolOutput
from toold_daemon.tools.registry import Registry

pytestmark = pytest.mark.trio


class Warmed(Tool[EchoArgs]):
    name: ClassVar[str] = "warmed"
    description: ClassVar[str] = "records when its planning was warmed, and where"
    args_type = EchoArgs

    def __init__(self) -> None:
        self.warmed: list[tuple[int, float]] = []

    def run(self, args: EchoArgs, ctx: ToolContext) -> ToolOutput:
        return ToolOutput(args.text)

    def warm_planning(self) -> None:
        self.warmed.append((threading.get_ident(), time.monotonic()))


async def test_planning_imports_wait_for_the_start_and_are_made_off_the_loop() -> None:
    tool = Warmed()
    registry = Registry()
    registry.register(tool)
    started = time.monotonic()
    await warm_planning_soon(registry)
    [(thread, when)] = tool.warmed
    assert thread != threading.get_ident(), "imported on the event loop's thread"
    assert when - started >= WARM_PLANNING_AFTER_SECONDS, "imported while the start's first clients came"
