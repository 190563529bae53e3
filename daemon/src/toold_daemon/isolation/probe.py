"""A tool that does nothing, run once at start to learn which isolation layers hold."""

from __future__ import annotations

from ..tools._base import Tool, ToolArgs, ToolContext, ToolOutput


class ProbeArgs(ToolArgs, frozen=True):
    pass


class Probe(Tool[ProbeArgs]):
    name = "_probe"
    description = "internal: report isolation layers"
    args_type = ProbeArgs
    side_effecting = True

    def run(self, args: ProbeArgs, ctx: ToolContext) -> ToolOutput:
        return ToolOutput("ok")
