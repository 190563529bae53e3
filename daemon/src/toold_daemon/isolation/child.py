"""The body of a forked child, after ``confine``: run a Python tool or supervise a command.

Everything the child says goes to its channel pipe as frames: ``Chunk`` while it runs,
then exactly one ``Outcome``. If the child dies before the outcome (killed, out of
memory), the trio side notices the end of the pipe and reports that instead.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec

from ..egress.process import listen_through_the_proxy
from ..errors import ToolError, from_os_error
from ..sandbox import Sandbox
from ..tools._base import ToolContext, ToolOutput
from ..undo.capture import run_capturing
from .confine import ConfinementFailed, confine, egress_links
from .prepare import Work
from .supervisor import Supervisor
from .wire import Chunk, Outcome, SpawnRequest, write_frame


def run_child(request: SpawnRequest, fds: list[int], work: Work, spawner_pid: int, daemon_pid: int) -> None:
    """Never returns: confines itself, does the work, writes the outcome, exits.
    ``fds``: the channel, and for a stdio server also the write end of its stderr pipe."""
    code = 0
    channel = fds[0]
    try:
        # fds received with SCM_RIGHTS are inheritable: the command must not get the
        # channel, or it could write forged frames (a fake outcome) to the daemon.
        os.set_inheritable(channel, False)
        try:
            layers = confine(request, fds, spawner_pid, work.landlock, protected=(daemon_pid,))
        except ConfinementFailed as exc:
            if request.stdio:
                os.write(fds[1], f"toold: {exc}\n".encode())
                os._exit(0)
            write_frame(channel, _error("IsolationUnavailable", "ISOLATION_UNAVAILABLE", str(exc)))
            os._exit(0)
        if request.stdio:
            links = egress_links()
            if links is not None:
                request = listen_through_the_proxy(request, links[0])
                links[0].close()
            exec_on_stdio(request, channel, fds[1])
        if request.zygote:
            from .zygote import serve

            serve(channel, layers, request.roots, egress_links())
            os._exit(0)
        if request.worker:
            from .worker import serve as serve_tools

            serve_tools(channel, layers, work)
            os._exit(0)
        links = egress_links()
        if links is not None and request.argv:  # a command of its own in proxy mode
            request = listen_through_the_proxy(request, links[0])
            links[0].close()
        os.environ.clear()
        os.environ.update(request.env)
        if request.argv:
            _supervise(request, channel, layers)
        else:
            outcome = run_tool(request, channel, work)
            write_frame(channel, msgspec.structs.replace(outcome, layers=layers))
    except BaseException as exc:  # the child must never fall back into the spawner's loop
        try:
            detail = f"{type(exc).__name__}: {exc}"[:300]
            write_frame(channel, _error("ExecutionFailed", "TOOL_FAILED", f"Tool failed: {detail}"))
        except BaseException:
            code = 71
            traceback.print_exc()
    finally:
        os._exit(code)


def exec_on_stdio(request: SpawnRequest, channel: int, stderr: int) -> None:
    """Become the server program, speaking on ``channel`` (stdin and stdout) and writing
    its diagnostics to ``stderr``. Its channel carries the server's protocol, not ours:
    the daemon parses it as untrusted input."""
    try:
        os.dup2(channel, 0)
        os.dup2(channel, 1)
        os.dup2(stderr, 2)
        for fd in (channel, stderr):
            if fd > 2:
                os.close(fd)
        if request.cwd:
            os.chdir(request.cwd)
        os.execve(request.argv[0], request.argv, request.env)  # noqa: S606 -- argv, never a shell
    except OSError as exc:
        os.write(2, f"toold: cannot start {request.argv[0]}: {exc.strerror}\n".encode())
    os._exit(127)


def _error(type_: str, code: str, message: str, **details: Any) -> Outcome:
    return Outcome(ok=False, error_type=type_, error_code=code, error_message=message, error_details=details)


def run_tool(request: SpawnRequest, channel: int, work: Work) -> Outcome:
    """Run (or preview) one Python tool call; its chunks go to ``channel`` as it runs."""
    tool, args, config, sandbox = work.tool, work.args, work.config, work.sandbox
    if tool is None or config is None:
        return _error("UnknownTool", "UNKNOWN_TOOL", f"the spawner does not know {request.tool!r}")
    if not isinstance(sandbox, Sandbox):
        return _error("PermissionDenied", "ROOT_UNREACHABLE", f"the workspace is not reachable: {sandbox}")
    ctx = ToolContext(
        call_id=request.call_id,
        sandbox=sandbox,
        config=config,
        resolved={k: Path(v) for k, v in request.resolved.items()},
        reads=dict(request.reads),
        emit=lambda stream, data: write_frame(channel, Chunk(stream=stream, data=data)),
        undo_budget=request.undo_budget,
        blobs=dict(request.blobs),
    )
    try:
        if request.preview:
            return Outcome(ok=True, content=tool.preview(args, ctx) or "")
        output: ToolOutput = run_capturing(tool, args, ctx)
    except ToolError as exc:
        details = dict(exc.details)
        read = details.pop("output", None)  # what the tool read before failing (an HTTP error's body)
        failed = _error(str(exc.type), exc.code, exc.message, **details)
        return msgspec.structs.replace(failed, content=read) if isinstance(read, str) else failed
    except OSError as exc:
        translated = from_os_error(exc, str(exc.filename or request.tool))
        return _error(str(translated.type), translated.code, translated.message, **translated.details)
    return Outcome(
        ok=True,
        content=output.content,
        display=None if output.display == output.content else output.display,  # not sent twice
        data=output.data,
        allow_truncation=output.allow_truncation,
        records=output.records,
        tail=output.tail,
        unseen_bytes=output.unseen.bytes,
        unseen_lines=output.unseen.lines,
        changes=output.changes,
    )


def _supervise(request: SpawnRequest, channel: int, layers: dict[str, str]) -> None:
    """Run the command with its own pipes and watch it to the end (``Supervisor``): it
    streams, captures (bounded), enforces the idle timeout and writes the outcome."""
    started = time.monotonic()
    if request.cwd:
        os.chdir(request.cwd)  # inherited by the command; this supervisor does not care
    pid, pipes = start_command(request, setsid=False)
    supervisor = Supervisor(layers)
    supervisor.add(request, channel, pid, pipes, started)
    while supervisor.active:
        supervisor.step()


def start_command(request: SpawnRequest, *, setsid: bool) -> tuple[int, dict[int, str]]:
    """Write the call's files, then start argv with fresh stdout/stderr pipes (in the
    current directory): (pid, {read end: stream name})."""
    for name, text in request.files.items():
        with open(os.path.join(request.temp, os.path.basename(name)), "w", encoding="utf-8") as f:
            f.write(text)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        # posix_spawn (vfork + exec in glibc) rather than fork: forking this Python process
        # would copy its page tables, which costs more than the whole command often does.
        own_umask = os.umask(request.umask)  # the command's files get the client's modes
        try:
            pid = os.posix_spawn(
                request.argv[0],
                request.argv,
                request.env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ],
                setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD),
                setsigmask=(),
                setsid=setsid,
            )
        finally:
            os.umask(own_umask)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, {out_r: "stdout", err_r: "stderr"}
