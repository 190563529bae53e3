"""run_code: a Python or bash snippet, written to the call's private temp dir and run there."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ..errors import bad_args
from ._base import Command, Tool, ToolArgs, ToolContext, ToolOutput
from ._data import CommandData

_FILES = {"python": "main.py", "bash": "main.sh"}


def _python() -> str:
    """The system interpreter when there is one, else the daemon's own."""
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


class RunCodeArgs(ToolArgs, frozen=True):
    """Run a code snippet."""

    language: Annotated[Literal["python", "bash"], Meta(description="python or bash")]
    code: Annotated[str, Meta(max_length=262_144, description="The program text")]
    args: Annotated[list[Annotated[str, Meta(max_length=4096)]], Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    env: Annotated[dict[str, str], Meta(description="Extra environment variables (after sanitization)")] = (
        msgspec.field(default_factory=dict)
    )
    timeout_ms: Annotated[int, Meta(ge=1, le=3_600_000)] = 60_000
    network: Annotated[bool, Meta(description="Allow network access (default: cut off)")] = False


class RunCode(Tool[RunCodeArgs]):
    name = "run_code"
    description = (
        "Run a short Python or bash program in an isolated process, without network unless network=true. "
        "Returns stdout, stderr and the exit code."
    )
    args_type = RunCodeArgs
    side_effecting = True
    risk = "high"
    data_type = CommandData
    output = "data: {stdout, stderr, exit_code, signal, duration_ms}"
    timeout_kind = "shell"

    def validate(self, args: RunCodeArgs) -> None:
        if "\0" in args.code or any("\0" in a for a in args.args):
            raise bad_args("code and args must not contain NUL bytes")
        if any(not k or "=" in k or "\0" in k + v for k, v in args.env.items()):
            raise bad_args("env names must be non-empty, without '=' or NUL")

    def locations(self, args: RunCodeArgs) -> list[str]:
        """Where the snippet acts: the workspace root (its working directory)."""
        return ["."]

    def summary(self, args: RunCodeArgs) -> str:
        first = next((line for line in args.code.splitlines() if line.strip()), "")
        net = ", network on" if args.network else ""
        return f"Run {args.language} ({len(args.code)} chars{net}): {first[:120]}"

    def timeout_seconds(self, args: RunCodeArgs) -> float | None:
        return args.timeout_ms / 1000

    def command(self, args: RunCodeArgs, ctx: ToolContext) -> Command:
        script = os.path.join("{tmp}", _FILES[args.language])
        interpreter = _python() if args.language == "python" else "/bin/bash"
        return Command(
            argv=[interpreter, script, *args.args],
            cwd=str(ctx.sandbox.roots[0]),
            network=args.network,
            env=dict(args.env),
            files={_FILES[args.language]: args.code},
            narrow_reads=True,
        )

    def run(self, args: RunCodeArgs, ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError("run_code runs as a command in an isolated child")
