"""Where tool code runs. The executor only sees the ``ToolRunner`` seam.

``SpawnRunner`` (``isolation.runner``) is what ``toold serve`` uses: every tool in a
confined worker or child. ``ThreadRunner`` is for a daemon built without the spawner
(embedding the service in-process, unit tests): it runs tools on threads of the
daemon process, which is acceptable only for read-only tools and only for a client
whose privileges are not lower than the daemon's (same uid, or root), so it refuses
anything else with IsolationUnavailable.

A call the tool declares small and bounded (``runs_inline``: a whole read of a regular
file up to 64 KiB) runs on the event loop instead: a thread hop costs more here
(~250 µs on the reference machine) than the read itself (~30 µs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import trio

from toold_protocol import Identity, IsolationLayer, ToolErrorType

from ..errors import ToolError
from ..tools._base import Tool, ToolContext, ToolOutput
from ..undo.capture import run_capturing


class ToolRunner(Protocol):
    async def run(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> ToolOutput: ...

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> None:
        """Start the call now if that needs no waiting (``run`` with the same ``ctx``
        finishes it); doing nothing is always correct."""

    def finished(self, ctx: ToolContext, interrupt_fd: int | None) -> ToolOutput | None:
        """The output of ``ctx``'s begun call if it is there now, or comes within a short
        wait on the loop's thread that ``interrupt_fd`` becoming readable ends (a failed
        call raises its ``ToolError``); None: ``run`` finishes it. Always returning None
        is correct."""

    def abandon(self, ctx: ToolContext) -> None:
        """``ctx``'s call was begun and will not be run."""

    def jobs_running(self) -> bool:
        """Whether background jobs run, whose output the event loop follows."""

    def spin_only_when(self, serves_one_call: Callable[[], bool]) -> None:
        """``serves_one_call()`` says whether the event loop serves nothing but the call
        asking: only then may a call hold the loop's thread a moment (a spin for its
        outcome). Never calling it is correct."""

    async def preview(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> str | None: ...


class ThreadRunner:
    #: What this runner gives, reported in ``welcome`` (and by ``toold doctor`` once it exists).
    ISOLATION = (
        IsolationLayer(
            name="process",
            available=False,
            detail="read-only tools run on daemon worker threads; no isolated child yet",
        ),
        IsolationLayer(
            name="privilege", available=True, detail="tools run only for clients of the daemon's own uid (or root)"
        ),
    )

    def __init__(self, max_threads: int = 8) -> None:
        self._limiter = trio.CapacityLimiter(max_threads)
        self._euid = os.geteuid()

    async def run(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> ToolOutput:
        if tool.side_effecting or tool.network:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE,
                "ISOLATION_UNAVAILABLE",
                f"{tool.name} has side effects or reaches the network and needs an isolated child, "
                "which this daemon lacks",
            )
        if identity.uid not in (self._euid, 0):
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE,
                "ISOLATION_UNAVAILABLE",
                f"this daemon runs as uid {self._euid} and cannot act for uid {identity.uid} "
                "without the isolated spawner",
            )
        if tool.runs_inline(args, ctx):
            return tool.run(args, ctx)
        try:
            return await trio.to_thread.run_sync(
                run_capturing, tool, args, ctx, limiter=self._limiter, abandon_on_cancel=True
            )
        except BaseException:
            ctx.cancelled.set()  # an abandoned thread stops at its next check
            raise

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> None:
        """Nothing starts early on a thread: ``run`` does it all."""

    def finished(self, ctx: ToolContext, interrupt_fd: int | None) -> ToolOutput | None:
        return None

    def abandon(self, ctx: ToolContext) -> None:
        pass

    def jobs_running(self) -> bool:
        return False  # (nothing runs in the background here)

    def spin_only_when(self, serves_one_call: Callable[[], bool]) -> None:
        pass  # nothing spins here

    async def preview(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> str | None:
        """A diff preview, only for clients with the daemon's own privileges (else None)."""
        if identity.uid not in (self._euid, 0):
            return None
        return await trio.to_thread.run_sync(tool.preview, args, ctx, limiter=self._limiter, abandon_on_cancel=True)
