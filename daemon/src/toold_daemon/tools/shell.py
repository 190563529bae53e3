"""shell (alias run_command): one command line through ``/bin/sh -c`` in an isolated child."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ..errors import bad_args
from ..redaction import show_blanks
from ._base import Command, Tool, ToolArgs, ToolContext, ToolOutput
from ._data import CommandData


class ShellArgs(ToolArgs, frozen=True):
    """Run a shell command."""

    command: Annotated[str, Meta(min_length=1, max_length=65_536, description="Command line for /bin/sh -c")]
    cwd: Annotated[str | None, Meta(description="Working directory inside the workspace (default: its root)")] = None
    timeout_ms: Annotated[int, Meta(ge=1, le=3_600_000, description="Kill the command after this long")] | None = None
    idle_timeout_ms: (
        Annotated[int, Meta(ge=1, le=3_600_000, description="Kill the command after this long without output")] | None
    ) = None
    background: Annotated[bool, Meta(description="Return at once with a job id; read or kill it with shell_jobs")] = (
        False
    )


class Shell(Tool[ShellArgs]):
    name = "shell"
    aliases = ("run_command",)
    description = (
        "Run a command with /bin/sh -c in the workspace, in an isolated process. Output streams while it runs; "
        "the result holds stdout, a [stderr] section and the exit code. A non-zero exit is an error result "
        "that still carries the output."
    )
    args_type = ShellArgs
    side_effecting = True
    risk = "high"
    data_type = CommandData
    output = (
        "data: {stdout, stderr, exit_code (negative: killed by that signal), signal, duration_ms}; "
        "background: {job_id, pid}"
    )
    timeout_kind = "shell"

    def validate(self, args: ShellArgs) -> None:
        if "\0" in args.command:
            raise bad_args("command contains a NUL byte")

    def paths(self, args: ShellArgs) -> list[str]:
        return [args.cwd] if args.cwd else []

    def locations(self, args: ShellArgs) -> list[str]:
        """Where the command acts: its cwd, or the workspace root (".")."""
        return [args.cwd or "."]

    def summary(self, args: ShellArgs) -> str:
        where = f" (in {args.cwd[:60]})" if args.cwd else ""
        where += " in the background" if args.background else ""
        line = show_blanks(args.command)
        room = 200 - len("Run: ") - len(where)
        if len(line) > room:  # keep the tail in view too: what runs last matters as much
            line = line[: room * 2 // 3] + " … " + line[-(room // 3 - 3) :]
        return f"Run: {line}{where}"

    def timeout_seconds(self, args: ShellArgs) -> float | None:
        return args.timeout_ms / 1000 if args.timeout_ms else None

    def command(self, args: ShellArgs, ctx: ToolContext) -> Command:
        cwd = ctx.resolve(args.cwd) if args.cwd else ctx.sandbox.roots[0]
        return Command(
            argv=["/bin/sh", "-c", args.command],
            cwd=str(cwd),
            idle_timeout_s=(args.idle_timeout_ms or 0) / 1000,
            background=args.background,
        )

    def run(self, args: ShellArgs, ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError("shell runs as a command in an isolated child")
