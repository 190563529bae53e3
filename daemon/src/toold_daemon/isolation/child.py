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

import msgspec

from ..egress.process import listen_through_the_proxy
from .command_start import start_command
from .confine import ConfinementFailed, confine, egress_links, wait_for_egress
from .prepare import Work
from .supervisor import Supervisor
from .tool_run import run_tool
from .wire import SpawnRequest, failure, write_frame

#: How long a finished command's child waits for its egress process (see ``wait_for_egress``):
#: longer than the runner waits for a call's records.
EGRESS_WAIT_SECONDS = 3.0


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
            layers = confine(request, fds, spawner_pid, work.landlock, protected=(daemon_pid,), groups=work.groups)
        except ConfinementFailed as exc:
            if request.stdio:
                os.write(fds[1], f"toold: {exc}\n".encode(errors="surrogateescape"))
                os._exit(0)
            write_frame(channel, failure("IsolationUnavailable", "ISOLATION_UNAVAILABLE", str(exc)))
            os._exit(0)
        if request.stdio:
            links = egress_links()
            if links is not None:
                request = listen_through_the_proxy(request, links[0])
                links[0].close()
            exec_on_stdio(request, channel, fds[1])
        # Everything below is Python that writes to pipes and sockets whose readers may go
        # (its channel, a tool's connections, an egress process): a write must fail with
        # EPIPE, not kill it. Only programs it starts get the default back (``start_command``).
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
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
            wait_for_egress(EGRESS_WAIT_SECONDS)  # the records of its last connections go out first
        else:
            outcome = run_tool(request, channel, work)
            write_frame(channel, msgspec.structs.replace(outcome, layers=layers))
    except BaseException as exc:  # the child must never fall back into the spawner's loop
        try:
            detail = f"{type(exc).__name__}: {exc}"[:300]
            write_frame(channel, failure("ExecutionFailed", "TOOL_FAILED", f"Tool failed: {detail}"))
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
        os.write(2, f"toold: cannot start {request.argv[0]}: {exc.strerror}\n".encode(errors="surrogateescape"))
    os._exit(127)


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
