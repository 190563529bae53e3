"""A call's context: its cancel event is made when first asked for, and only once."""

from __future__ import annotations

import threading
from pathlib import Path

from toold_daemon.tools import ToolContext

from .conftest import make_ctx


def test_a_context_makes_its_cancel_event_only_when_asked(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert ctx.cancel_event is None  # most calls never look at it
    event = ctx.cancelled
    assert ctx.cancelled is event and ctx.cancel_event is event


def test_threads_that_ask_first_at_once_share_one_event(tmp_path: Path) -> None:
    """The loop (to set it) and a tool's thread (to check it) may ask first at the same
    time: both must hold the same event, or a cancel would never reach the tool."""
    for _ in range(200):
        ctx = make_ctx(tmp_path)
        start = threading.Barrier(8)
        seen: list[threading.Event] = []
        threads = [threading.Thread(target=_ask, args=(ctx, start, seen)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(event) for event in seen}) == 1
        ctx.cancelled.set()
        assert all(event.is_set() for event in seen)


def _ask(ctx: ToolContext, start: threading.Barrier, seen: list[threading.Event]) -> None:
    start.wait()
    seen.append(ctx.cancelled)
