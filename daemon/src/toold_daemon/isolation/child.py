"""The body of a forked child, after ``confine``: run a Python tool or supervise a command.

Everything the child says goes to its channel pipe as frames: ``Chunk`` while it runs,
then exactly one ``Outcome``. If the child dies before the outcome (killed, out of
memory), the trio side notices the end of the pipe and reports that instead.
"""

from __future__ import annotations

import codecs
import os
import selectors
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec

from ..errors import ToolError, from_os_error
from ..sandbox import Sandbox
from ..tools._base import ToolContext, ToolOutput
from .confine import ConfinementFailed, confine
from .prepare import Work
from .wire import Chunk, Outcome, SpawnRequest, write_frame

_READ_SIZE = 65536
DRAIN_AFTER_EXIT_S = 0.3  # grandchildren may hold the pipes open; stop reading after this


def run_child(request: SpawnRequest, channel: int, work: Work, spawner_pid: int) -> None:
    """Never returns: confines itself, does the work, writes the outcome, exits."""
    code = 0
    try:
        # fds received with SCM_RIGHTS are inheritable: the command must not get the
        # channel, or it could write forged frames (a fake outcome) to the daemon.
        os.set_inheritable(channel, False)
        try:
            layers = confine(request, [channel], spawner_pid, work.landlock)
        except ConfinementFailed as exc:
            write_frame(channel, _error("IsolationUnavailable", "ISOLATION_UNAVAILABLE", str(exc)))
            os._exit(0)
        if request.zygote:
            from .zygote import serve

            serve(channel, layers)
            os._exit(0)
        os.environ.clear()
        os.environ.update(request.env)
        outcome = _supervise(request, channel) if request.argv else _run_tool(request, channel, work)
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


def _error(type_: str, code: str, message: str, **details: Any) -> Outcome:
    return Outcome(ok=False, error_type=type_, error_code=code, error_message=message, error_details=details)


def _run_tool(request: SpawnRequest, channel: int, work: Work) -> Outcome:
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
    )
    try:
        if request.preview:
            return Outcome(ok=True, content=tool.preview(args, ctx) or "")
        output: ToolOutput = tool.run(args, ctx)
    except ToolError as exc:
        return _error(str(exc.type), exc.code, exc.message, **exc.details)
    except OSError as exc:
        translated = from_os_error(exc, str(exc.filename or request.tool))
        return _error(str(translated.type), translated.code, translated.message, **translated.details)
    return Outcome(
        ok=True,
        content=output.content,
        display=output.display,
        data=output.data,
        allow_truncation=output.allow_truncation,
        records=output.records,
    )


class _Captured:
    """Keeps the first ``keep`` bytes of a stream and counts the rest: memory stays bounded
    whatever the command prints."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]

    def text(self) -> str:
        text = self.head.decode("utf-8", errors="replace")
        if _looks_binary(self.head):
            text = f"[binary output: {self.total} bytes, not shown]"
        elif self.total > len(self.head):
            text += f"\n[... {self.total - len(self.head)} more bytes of output omitted]"
        return text


def _looks_binary(data: bytes | bytearray) -> bool:
    sample = bytes(data[:8192])
    if b"\0" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(sample) - 4  # a character cut at the end of the sample is fine
    return False


def _supervise(request: SpawnRequest, channel: int) -> Outcome:
    """Run the command with its own pipes; stream, capture (bounded), enforce the idle
    timeout; then report stdout, a ``[stderr]`` section and the exit code."""
    started = time.monotonic()
    if request.cwd:
        os.chdir(request.cwd)  # inherited by the command; this supervisor does not care
    pid, pipes = start_command(request, setsid=False)
    return watch_command(request, channel, pid, pipes, started)


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
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, {out_r: "stdout", err_r: "stderr"}


def watch_command(request: SpawnRequest, channel: int, pid: int, pipes: dict[int, str], started: float) -> Outcome:
    """Stream and capture a started command's output until it ends; its outcome."""
    captured = {"stdout": _Captured(request.keep_bytes), "stderr": _Captured(request.keep_bytes)}
    status = _pump(request, channel, pid, pipes, captured)
    elapsed_ms = round((time.monotonic() - started) * 1000, 1)
    return _command_outcome(status, captured, elapsed_ms, idle=request.idle_timeout_s)


def _pump(
    request: SpawnRequest, channel: int, pid: int, streams: dict[int, str], captured: dict[str, _Captured]
) -> int | None:
    """Read both pipes until they close, or until the command has exited and the drain
    time has passed. Returns the wait status, or None when the idle timeout killed it."""
    selector = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in captured}
    streamed = 0
    last_output = time.monotonic()
    status: int | None = None
    exited_at: float | None = None
    idle_killed = False
    while selector.get_map():
        if status is None:
            waited, wstatus = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                status, exited_at = wstatus, time.monotonic()
        now = time.monotonic()
        if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT_S:
            break
        if request.idle_timeout_s and status is None and now - last_output > request.idle_timeout_s:
            _kill_command(pid)
            idle_killed = True
        for key, _ in selector.select(timeout=0.05):
            fd = int(key.fd)
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(fd)
                os.close(fd)
                continue
            last_output = time.monotonic()
            name = streams[fd]
            captured[name].add(data)
            if streamed < request.stream_limit_bytes:
                piece = data[: request.stream_limit_bytes - streamed]
                streamed += len(piece)
                text = decoders[name].decode(piece)
                if text:
                    write_frame(channel, Chunk(stream=name, data=text))  # type: ignore[arg-type]
                if streamed >= request.stream_limit_bytes:
                    note = f"\n[toold: streaming stopped after {streamed} bytes; the result keeps the output]\n"
                    write_frame(channel, Chunk(stream="stderr", data=note))
    if status is None:
        _, status = os.waitpid(pid, 0)
    return None if idle_killed else status


def _kill_command(pid: int) -> None:
    """Kill the command. What it started is killed with the whole process group by the
    daemon once this child has reported (the group includes this supervisor)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _command_outcome(status: int | None, captured: dict[str, _Captured], elapsed_ms: float, *, idle: float) -> Outcome:
    stdout, stderr = captured["stdout"].text(), captured["stderr"].text()
    content = stdout
    if captured["stderr"].total:
        content += ("" if not content or content.endswith("\n") else "\n") + "[stderr]\n" + stderr
    data: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "duration_ms": elapsed_ms}
    if status is None:
        data["exit_code"] = None
        message = f"no output for {idle:g}s (idle timeout); the command was killed"
        return _failure_with_output("Timeout", "IDLE_TIMEOUT", message, content, data)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        data["exit_code"] = -signum
        data["signal"] = signal.Signals(signum).name
        return _failure_with_output(
            "ExecutionFailed", "KILLED_BY_SIGNAL", f"command killed by {signal.Signals(signum).name}", content, data
        )
    exit_code = os.WEXITSTATUS(status)
    data["exit_code"] = exit_code
    content += ("" if not content or content.endswith("\n") else "\n") + f"[exit code {exit_code}]"
    if exit_code != 0:
        return _failure_with_output("ExecutionFailed", "NON_ZERO_EXIT", f"exit code {exit_code}", content, data)
    return Outcome(ok=True, content=content, data=data)


def _failure_with_output(type_: str, code: str, message: str, content: str, data: dict[str, Any]) -> Outcome:
    return Outcome(
        ok=False, content=content, data=data, error_type=type_, error_code=code, error_message=message,
        error_details={"exit_code": data.get("exit_code")},
    )  # fmt: skip
