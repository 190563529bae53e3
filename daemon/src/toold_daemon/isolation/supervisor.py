"""Watching started commands: one event loop, one thread, any number of commands.

For each command the supervisor reads its stdout/stderr pipes, streams what they carry
to the call's channel as ``Chunk`` frames (up to the stream limit), keeps a bounded
capture for the result, enforces the idle timeout, reaps it through a pidfd, and ends
with one ``Outcome`` frame. The fork path watches its one command with it; a zygote
watches all the commands it started, next to its own request socket.

Channels are written without blocking: while a call's reader lags, that command's
pipes are not read (so the command itself waits on its full pipe) and every other
command goes on. A reader that went away (the call was cancelled) ends the watch: the
command is killed and reaped, and the runner kills its group.

A zygote in proxy mode gives each command a listener for its proxy connections and the
supervisor holds it: it goes to the egress process (``Listener.hand_over``) once a
connection waits on it, or is closed when the command is done. Most commands never
connect, and then the egress process never hears of them (each listener it serves
costs it a task, and the runner a message to end it); the outcome says so
(``Outcome.unconnected``), so that the runner has nothing to end there either.
"""

from __future__ import annotations

import base64
import codecs
import os
import select
import selectors
import signal
import time
from typing import Any, Literal, Protocol

import msgspec

from ..output import Unseen, count_lines
from .wire import Chunk, Outcome, SpawnRequest, frame

_READ_SIZE = 65536
DRAIN_AFTER_EXIT_S = 0.3  # grandchildren may hold the pipes open; stop reading after this
_POLL_WITHOUT_PIDFD_S = 0.05  # kernels before 5.3: look for the exit this often

Role = Literal["pipe", "exit", "channel", "listener", "other"]


class Listener(Protocol):
    """A command's proxy listener, held until a connection waits on it."""

    def fileno(self) -> int: ...

    def hand_over(self) -> bool:
        """Give it to the egress process and close our copy: False if it could not be
        given (the command's connections are then refused)."""
        ...

    def close(self) -> None: ...


class Captured:
    """Keeps the first ``keep`` bytes of a stream and counts all of it (bytes and lines):
    memory stays bounded whatever the command prints, and the result can say exactly how
    much it does not show."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.total = 0
        self.newlines = 0
        self.ends_with_newline = True

    def add(self, data: bytes) -> None:
        if not data:
            return
        self.total += len(data)
        self.newlines += data.count(b"\n")
        self.ends_with_newline = data.endswith(b"\n")
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]

    @property
    def lines(self) -> int:
        return self.newlines + (0 if self.ends_with_newline or not self.total else 1)

    @property
    def binary(self) -> bool:
        return looks_binary(self.head)

    def text(self) -> str:
        """The kept head as text (a character cut at the end is left out); output that is
        mostly binary as base64 after a line that says so (as much of it as ``keep``
        holds once encoded)."""
        if self.binary:
            raw = bytes(self.head[: self.keep * 3 // 4])
            shown = f", the first {len(raw)} shown" if len(raw) < self.total else ""
            return f"[binary output: {self.total} bytes as base64{shown}]\n{base64.b64encode(raw).decode()}"
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder.decode(bytes(self.head), final=self.total == len(self.head))

    def unseen(self, shown: str) -> Unseen:
        """What the stream held beyond ``shown`` (this stream's ``text()``)."""
        if self.binary:
            return Unseen()
        return Unseen(
            bytes=max(0, self.total - len(shown.encode("utf-8", "surrogatepass"))),
            lines=max(0, self.lines - count_lines(shown)),
        )


def looks_binary(data: bytes | bytearray) -> bool:
    """Mostly binary: a NUL byte, or more than three characters in ten that are not text.
    A stray byte that is not UTF-8 does not make readable output binary."""
    sample = bytes(data[:8192])
    if b"\0" in sample:
        return True
    if not sample:
        return False
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(sample, final=False)
    odd = sum(1 for ch in text if ch == "\ufffd" or (ch < " " and ch not in "\n\r\t\x1b\x08\x0c"))
    return odd * 10 > 3 * max(1, len(text))


class _Watched(msgspec.Struct, eq=False):
    """One command being watched, and what is still owed to its channel."""

    request: SpawnRequest
    channel: int
    pid: int
    pipes: dict[int, str]  # open read ends -> stream name
    started: float
    pidfd: int | None = None
    captured: dict[str, Captured] = msgspec.field(default_factory=dict)
    decoders: dict[str, codecs.IncrementalDecoder] = msgspec.field(default_factory=dict)
    streamed: int = 0
    last_output: float = msgspec.field(default_factory=time.monotonic)
    status: int | None = None  # wait status, once reaped
    exited_at: float | None = None
    idle_killed: bool = False
    pending: bytearray = msgspec.field(default_factory=bytearray)  # frames not yet on the channel
    paused: bool = False  # pipes unregistered while ``pending`` waits for the reader
    finished: bool = False  # the outcome is in ``pending``; close once it is written
    listener: Listener | None = None  # held until a connection waits on it
    held: bool = False  # the supervisor was given a listener to hold (zygotes in proxy mode)
    handed_over: bool = False  # ... and it went to the egress process


class Supervisor:
    """Watches commands until each has written its outcome. ``step`` runs the loop once
    and returns the ready fds it was asked to watch for the caller (``watch_other``)."""

    def __init__(self, layers: dict[str, str]) -> None:
        self._layers = layers
        self._selector = selectors.DefaultSelector()
        self._watched: set[_Watched] = set()

    @property
    def active(self) -> bool:
        return bool(self._watched)

    def watch_other(self, fd: int) -> None:
        self._selector.register(fd, selectors.EVENT_READ, ("other", None, fd))

    def forget_other(self, fd: int) -> None:
        self._selector.unregister(fd)

    def add(
        self,
        request: SpawnRequest,
        channel: int,
        pid: int,
        pipes: dict[int, str],
        started: float,
        *,
        listener: Listener | None = None,
    ) -> None:
        """Watch a started command; from now on the supervisor owns its fds (and its
        listener) and reaps it."""
        watched = _Watched(request, channel, pid, dict(pipes), started, listener=listener, held=listener is not None)
        if listener is not None:
            self._selector.register(listener.fileno(), selectors.EVENT_READ, ("listener", watched, listener.fileno()))
        for name in ("stdout", "stderr"):
            watched.captured[name] = Captured(request.keep_bytes)
            watched.decoders[name] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        os.set_blocking(channel, False)
        for fd in pipes:
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ, ("pipe", watched, fd))
        try:
            watched.pidfd = os.pidfd_open(pid)
        except OSError:
            watched.pidfd = None  # polled instead
        else:
            self._selector.register(watched.pidfd, selectors.EVENT_READ, ("exit", watched, watched.pidfd))
        self._watched.add(watched)

    def step(self, max_wait: float | None = None) -> list[int]:
        others: list[int] = []
        timeout = self._timeout()
        if max_wait is not None:
            timeout = max_wait if timeout is None else min(timeout, max_wait)
        for key, _events in self._selector.select(timeout):
            role, watched, fd = key.data
            if role == "other":
                others.append(fd)
            elif watched in self._watched:  # an earlier event of this round may have dropped it
                self._on_ready(role, watched, fd)
        now = time.monotonic()
        for watched in list(self._watched):
            self._check_time(watched, now)
        return others

    def _timeout(self) -> float | None:
        """Until the nearest idle or drain deadline (None: only events matter)."""
        now = time.monotonic()
        deadlines: list[float] = []
        for watched in self._watched:
            if watched.status is None:
                if watched.pidfd is None:
                    deadlines.append(now + _POLL_WITHOUT_PIDFD_S)
                if watched.request.idle_timeout_s and not watched.idle_killed and not watched.paused:
                    deadlines.append(watched.last_output + watched.request.idle_timeout_s)
            elif watched.exited_at is not None and watched.pipes and not watched.paused:
                deadlines.append(watched.exited_at + DRAIN_AFTER_EXIT_S)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _on_ready(self, role: Role, watched: _Watched, fd: int) -> None:
        if role == "pipe":
            self._read(watched, fd)
        elif role == "exit":
            self._reap(watched, os.WNOHANG)
        elif role == "channel":
            self._flush(watched)
        elif role == "listener":
            self._hand_over(watched)
        if watched in self._watched:
            self._finish_if_done(watched)

    def _read(self, watched: _Watched, fd: int) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(watched, fd)
            return
        watched.last_output = time.monotonic()
        name = watched.pipes[fd]
        watched.captured[name].add(data)
        limit = watched.request.stream_limit_bytes
        if watched.streamed < limit:
            piece = data[: limit - watched.streamed]
            watched.streamed += len(piece)
            text = watched.decoders[name].decode(piece)
            if text:
                watched.pending += frame(Chunk(stream=name, data=text))  # type: ignore[arg-type]
            if watched.streamed >= limit:
                note = f"\n[toold: streaming stopped after {watched.streamed} bytes; the result keeps the output]\n"
                watched.pending += frame(Chunk(stream="stderr", data=note))
            self._flush(watched)

    def _flush(self, watched: _Watched) -> None:
        """Write what the channel takes now; pause the command's pipes while some is left."""
        try:
            while watched.pending:
                written = os.write(watched.channel, watched.pending)
                del watched.pending[:written]
        except BlockingIOError:
            pass
        except OSError:  # the reader is gone: nobody wants this command any more
            self._abandon(watched)
            return
        if watched.pending and not watched.paused:
            watched.paused = True
            for pipe in watched.pipes:
                self._selector.unregister(pipe)
            self._selector.register(watched.channel, selectors.EVENT_WRITE, ("channel", watched, watched.channel))
        elif not watched.pending and watched.paused:
            watched.paused = False
            watched.last_output = time.monotonic()  # waiting on the reader is not idleness
            self._selector.unregister(watched.channel)
            for pipe in watched.pipes:
                self._selector.register(pipe, selectors.EVENT_READ, ("pipe", watched, pipe))

    def _hand_over(self, watched: _Watched) -> None:
        """A connection waits on the command's listener: the egress process serves it."""
        listener, watched.listener = watched.listener, None
        if listener is not None:
            self._selector.unregister(listener.fileno())
            watched.handed_over = listener.hand_over()

    def _settle_listener(self, watched: _Watched) -> None:
        """Before the outcome: a connection made just before the command ended still goes
        to the egress process (which refuses it once the call is over, or records it);
        without one the listener is closed here, unserved."""
        listener = watched.listener
        if listener is None:
            return
        if select.select([listener], [], [], 0)[0]:
            self._hand_over(watched)
        else:
            self._close_listener(watched)

    def _close_listener(self, watched: _Watched) -> None:
        """Close the command's listener unserved, if it still holds one."""
        if watched.listener is not None:
            self._selector.unregister(watched.listener.fileno())
            watched.listener.close()
            watched.listener = None

    def _reap(self, watched: _Watched, flags: int) -> None:
        try:
            waited, status = os.waitpid(watched.pid, flags)
        except ChildProcessError:
            waited, status = watched.pid, 0  # someone else reaped it; nothing more to learn
        if waited != watched.pid:
            return
        watched.status, watched.exited_at = status, time.monotonic()
        if watched.pidfd is not None:
            self._selector.unregister(watched.pidfd)
            os.close(watched.pidfd)
            watched.pidfd = None

    def _check_time(self, watched: _Watched, now: float) -> None:
        if watched.status is None and watched.pidfd is None:
            self._reap(watched, os.WNOHANG)
        if self._idle_too_long(watched, now):
            _kill(watched.pid)  # its group is killed by the runner once the outcome is in
            watched.idle_killed = True
        drained = watched.exited_at is not None and now - watched.exited_at > DRAIN_AFTER_EXIT_S
        if drained and watched.pipes and not watched.paused:  # what a slow reader is owed is still read
            for fd in list(watched.pipes):
                self._close_pipe(watched, fd)
        self._finish_if_done(watched)

    @staticmethod
    def _idle_too_long(watched: _Watched, now: float) -> bool:
        idle = watched.request.idle_timeout_s
        waiting = watched.status is None and not watched.idle_killed and not watched.paused
        return bool(idle) and waiting and now - watched.last_output > idle

    def _finish_if_done(self, watched: _Watched) -> None:
        """Once reaped and read to the end (or drained): queue the outcome, and close the
        channel once everything queued is written."""
        if not watched.finished and watched.status is not None and not watched.pipes:
            watched.finished = True
            self._settle_listener(watched)
            watched.pending += frame(self._outcome(watched))
            self._flush(watched)
        if watched.finished and not watched.pending and watched in self._watched:
            self._drop(watched)

    def _outcome(self, watched: _Watched) -> Outcome:
        elapsed_ms = round((time.monotonic() - watched.started) * 1000, 1)
        status = None if watched.idle_killed else watched.status
        outcome = command_outcome(status, watched.captured, elapsed_ms, idle=watched.request.idle_timeout_s)
        unconnected = watched.held and not watched.handed_over
        return msgspec.structs.replace(outcome, layers=self._layers, unconnected=unconnected)

    def _close_pipe(self, watched: _Watched, fd: int) -> None:
        if not watched.paused:
            self._selector.unregister(fd)
        del watched.pipes[fd]
        os.close(fd)

    def _abandon(self, watched: _Watched) -> None:
        if watched.status is None:
            _kill(watched.pid)
            self._reap(watched, 0)
        self._drop(watched)

    def _drop(self, watched: _Watched) -> None:
        self._close_listener(watched)
        for fd in list(watched.pipes):
            self._close_pipe(watched, fd)
        if watched.paused:
            self._selector.unregister(watched.channel)
        if watched.pidfd is not None:
            self._selector.unregister(watched.pidfd)
            os.close(watched.pidfd)
        os.close(watched.channel)
        self._watched.discard(watched)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def command_outcome(status: int | None, captured: dict[str, Captured], elapsed_ms: float, *, idle: float) -> Outcome:
    """stdout, then a ``[stderr]`` section; the exit code as the tail (kept by every cut);
    what the streams held beyond their kept heads as ``unseen``. A failure keeps the output."""
    stdout, stderr = captured["stdout"].text(), captured["stderr"].text()
    unseen = _sum(captured["stdout"].unseen(stdout), captured["stderr"].unseen(stderr))
    content = stdout
    if captured["stderr"].total:
        content += ("" if not content or content.endswith("\n") else "\n") + "[stderr]\n" + stderr
    data: dict[str, Any] = {"stdout": stdout, "stderr": stderr, "duration_ms": elapsed_ms}
    tail = ""
    if status is None:
        data["exit_code"] = None
        failed = ("Timeout", "IDLE_TIMEOUT", f"no output for {idle:g}s (idle timeout); the command was killed")
    elif os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        data["exit_code"], data["signal"] = -os.WTERMSIG(status), name
        failed = ("ExecutionFailed", "KILLED_BY_SIGNAL", f"command killed by {name}")
    else:
        data["exit_code"] = exit_code = os.WEXITSTATUS(status)
        tail = f"[exit code {exit_code}]"
        if exit_code == 0:
            return Outcome(
                ok=True, content=content, data=data, tail=tail, unseen_bytes=unseen.bytes, unseen_lines=unseen.lines
            )
        failed = ("ExecutionFailed", "NON_ZERO_EXIT", f"exit code {exit_code}")
    type_, code, message = failed
    return Outcome(
        ok=False, content=content, data=data, error_type=type_, error_code=code, error_message=message,
        error_details={"exit_code": data.get("exit_code")}, tail=tail,
        unseen_bytes=unseen.bytes, unseen_lines=unseen.lines,
    )  # fmt: skip


def _sum(first: Unseen, second: Unseen) -> Unseen:
    return Unseen(first.bytes + second.bytes, first.lines + second.lines, first.exact and second.exact)
