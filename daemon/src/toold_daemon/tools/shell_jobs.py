"""shell_jobs: list, read and kill the background commands of the caller's uid."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..errors import ToolError, bad_args
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import ShellJobsData


class ShellJobsArgs(ToolArgs, frozen=True):
    """Manage background shell commands."""

    action: Annotated[Literal["list", "output", "kill"], Meta(description="list, output (so far) or kill")]
    job_id: Annotated[str, Meta(max_length=64, description="The job (for output and kill)")] = ""


class ShellJobs(Tool[ShellJobsArgs]):
    name = "shell_jobs"
    data_type = ShellJobsData
    output = (
        "data: list {jobs: [{job_id, state, pid, exit_code, command}]}; "
        "output {job_id, state, exit_code, total_chars, network (once ended)}; kill {job_id}"
    )
    description = (
        "Background shell commands started with shell(background=true): list them, read their output so far, "
        "or kill one (its whole process tree)."
    )
    args_type = ShellJobsArgs
    in_daemon = True

    def validate(self, args: ShellJobsArgs) -> None:
        if args.action != "list" and not args.job_id:
            raise bad_args(f"action {args.action!r} needs a job_id")

    def summary(self, args: ShellJobsArgs) -> str:
        return f"Background jobs: {args.action} {args.job_id}".strip()

    def run(self, args: ShellJobsArgs, ctx: ToolContext) -> ToolOutput:
        if ctx.jobs is None or ctx.identity is None:
            raise ToolError(ToolErrorType.ISOLATION_UNAVAILABLE, "NO_JOBS", "this daemon runs no background jobs")
        uid = ctx.identity.uid
        if args.action == "list":
            jobs = ctx.jobs.of(uid)
            rows = [
                {"job_id": j.job_id, "state": j.state, "pid": j.pid, "exit_code": j.exit_code, "command": j.command}
                for j in jobs
            ]
            text = "\n".join(f"{r['job_id']} [{r['state']}] pid {r['pid']}: {r['command']}" for r in rows)
            return ToolOutput(text or "no background jobs", data={"jobs": rows})
        job = ctx.jobs.get(uid, args.job_id)
        if job is None:
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "UNKNOWN_JOB", f"no job {args.job_id!r} of yours")
        if args.action == "kill":
            if job.state == "running" and job.kill is not None:
                job.kill()
            return ToolOutput(f"killed {job.job_id}", data={"job_id": job.job_id})
        state = f"[{job.state}" + (f", exit code {job.exit_code}" if job.exit_code is not None else "") + "]"
        return ToolOutput(
            f"{job.job_id} {state}\n{job.output()}",
            data={
                "job_id": job.job_id,
                "state": job.state,
                "exit_code": job.exit_code,
                "total_chars": job.total,
                **job.network,  # set once the job has ended: its connections, journaled with this call
            },
        )
