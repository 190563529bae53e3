"""What a call's child sends back on its channel: streamed chunks, then one outcome.

``collect`` reads the frames until the outcome (streaming text on as it comes, keeping a
bounded copy for the partial output); ``raise_for`` turns a failed outcome into the
error it reports. A channel that breaks the framing is a typed error, never the daemon's.
"""

from __future__ import annotations

import os

import msgspec
import trio

from toold_protocol import ToolErrorType

from ..errors import ToolError
from ..execution.results import OUTPUT_DETAILS
from ..output import Unseen
from ..tools._base import ToolContext, ToolOutput
from .wire import Chunk, FrameBuffer, Outcome, child_decoder


class ChildFailed(ToolError):
    pass


async def collect(read_end: int, ctx: ToolContext, keep: int) -> Outcome:
    """Frames until the outcome; streamed text goes to ``ctx.emit`` and (at most ``keep``
    characters of it) ``ctx.partial``."""
    buffer = FrameBuffer()
    kept = 0
    with _Channel(read_end) as channel:
        while True:
            data = await channel.receive_some()
            if not data:
                break
            chunks: list[Chunk] = []
            outcome: Outcome | None = None
            for message in decode_frames(buffer, data):
                if isinstance(message, Outcome):
                    outcome = message
                    break
                chunks.append(message)
            for stream_name, text, count in _coalesce(chunks):
                room = max(0, keep - kept)
                if room:
                    ctx.partial.append(text[:room])
                    kept += len(text)
                if len(text) > room:
                    dropped = text[room:]
                    ctx.partial_dropped[0] += len(dropped.encode("utf-8", "surrogatepass"))
                    ctx.partial_dropped[1] += dropped.count("\n")
                if ctx.emit is not None:
                    ctx.emit(stream_name, text, count)
            if outcome is not None:
                return outcome
    raise ChildFailed(
        ToolErrorType.EXECUTION_FAILED,
        "CHILD_DIED",
        "Tool failed: the isolated child exited without a result (killed, or out of memory)",
        output="".join(ctx.partial) or None,
    )


class _Channel:
    """Reads of the channel (``b""`` at its end), closed on leaving. A short command's
    channel holds its whole answer by the time the loop looks: the first read takes it
    without a trip through the event loop (a trio stream takes one per read); every later
    read lets the other tasks run first, so that a command that never stops printing
    cannot keep the loop to itself. (A class: ``asynccontextmanager``'s generator costs
    about a microsecond more, on every command.)"""

    __slots__ = ("_fd", "_first")

    def __init__(self, read_end: int) -> None:
        os.set_blocking(read_end, False)
        self._fd = read_end
        self._first = True

    def __enter__(self) -> _Channel:
        return self

    def __exit__(self, *_exc: object) -> None:
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)

    async def receive_some(self) -> bytes:
        if not self._first:
            await trio.lowlevel.checkpoint()
        self._first = False
        while True:
            try:
                return os.read(self._fd, 65536)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)


_TYPES = {t.value for t in ToolErrorType}


def raise_for(outcome: Outcome) -> None:
    """A failed outcome as the ToolError it reports."""
    if not outcome.ok:
        error = ToolError(
            ToolErrorType(outcome.error_type) if outcome.error_type in _TYPES else ToolErrorType.EXECUTION_FAILED,
            outcome.error_code or "TOOL_FAILED",
            outcome.error_message,
            output=outcome.content or None,
            output_tail=outcome.tail or None,
            unseen_bytes=outcome.unseen_bytes or None,
            unseen_lines=outcome.unseen_lines or None,
            **{k: v for k, v in outcome.error_details.items() if k not in OUTPUT_DETAILS},
        )
        error.changes = list(outcome.changes)
        raise error


_COALESCE_CHARS = 64 * 1024


def decode_frames(buffer: FrameBuffer, data: bytes) -> list[Chunk | Outcome]:
    """The child's messages in ``data``; a malformed channel is a typed ChildFailed."""
    try:
        return [child_decoder.decode(body) for body in buffer.feed(data)]
    except (ValueError, msgspec.DecodeError) as exc:
        raise ChildFailed(
            ToolErrorType.EXECUTION_FAILED, "CHILD_PROTOCOL", f"Tool failed: malformed message from the child: {exc}"
        ) from None


def _coalesce(chunks: list[Chunk]) -> list[tuple[str, str, int]]:
    """Merge consecutive chunks of the same stream that arrived together (up to 64 KiB),
    so a chatty command costs a few events rather than one per line: (stream, text, merged)."""
    merged: list[tuple[str, str, int]] = []
    for chunk in chunks:
        if merged and merged[-1][0] == chunk.stream and len(merged[-1][1]) + len(chunk.data) <= _COALESCE_CHARS:
            stream_name, text, count = merged[-1]
            merged[-1] = (stream_name, text + chunk.data, count + 1)
        else:
            merged.append((chunk.stream, chunk.data, 1))
    return merged


def output_of(outcome: Outcome) -> ToolOutput:
    """A worker's or child's outcome as the tool's output; a failed one raises its error."""
    raise_for(outcome)
    return ToolOutput(
        outcome.content,
        outcome.display,
        outcome.data,
        outcome.allow_truncation,
        outcome.records,
        tail=outcome.tail,
        unseen=Unseen(outcome.unseen_bytes, outcome.unseen_lines),
        changes=list(outcome.changes),
    )
