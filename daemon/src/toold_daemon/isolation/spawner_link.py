"""The protocol process's end of the spawner's control socket: one request at a time,
each reply read whole, whatever cancels the caller.

The spawner answers at once (it only forks) but is single-threaded: a caller that stops
waiting leaves its reply owed, and the next exchange reads it first (sweeping whatever
it says was started for nobody), so every later caller gets its own answer.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import msgspec
import trio

from toold_protocol import ToolErrorType

from ..errors import ToolError
from .sockets import PeerGone, send_with_fd
from .sweep import sweep
from .wire import FrameBuffer, Spawned, SpawnRequest, TempDone, TempWanted, frame

log = logging.getLogger(__name__)
SPAWNER_SILENT_SECONDS = 10.0  # the spawner answers in milliseconds; past this a caller stops waiting
_spawned_decoder = msgspec.msgpack.Decoder(Spawned)


class SpawnerLink:
    def __init__(self, spawner_pid: int, control: socket.socket) -> None:
        self.spawner_pid = spawner_pid
        self._control = trio.socket.from_stdlib_socket(control)
        self._lock = trio.Lock()
        self._replies = FrameBuffer()  # what the spawner sent and no exchange has read yet
        self._owed: list[str] = []  # call tokens of requests whose callers gave up waiting

    def close(self) -> None:
        self._control.close()  # the spawner then removes every temp dir it made

    async def chore(self, message: TempWanted | TempDone) -> Spawned:
        """One request to the spawner without an fd; an exited spawner is an error reply."""
        try:
            return await self.exchange(frame(message), None)
        except (PeerGone, OSError):
            return Spawned(error="the spawner process has exited")
        except trio.TooSlowError:
            return Spawned(error=f"the spawner did not answer within {SPAWNER_SILENT_SECONDS:g} s")

    async def ask(
        self, request: SpawnRequest, channel_write_end: int | list[int], *, sent: Callable[[], object] | None = None
    ) -> int:
        """The pid of the child the spawner forked for ``request``. ``sent`` is called
        once the request is written, before the reply is awaited."""
        try:
            reply = await self.exchange(frame(request), channel_write_end, token=request.token, sent=sent)
        except (PeerGone, OSError):
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE, "SPAWNER_GONE", "the spawner process has exited"
            ) from None
        except trio.TooSlowError:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE,
                "SPAWNER_SLOW",
                f"the spawner did not answer within {SPAWNER_SILENT_SECONDS:g} s; try again",
            ) from None
        if reply.error or reply.pid <= 0:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE, "SPAWN_FAILED", f"could not start a child: {reply.error}"
            )
        return reply.pid

    async def exchange(
        self,
        data: bytes | bytearray,
        fds: int | list[int] | None,
        *,
        token: str = "",
        sent: Callable[[], object] | None = None,
    ) -> Spawned:
        """Send one frame to the spawner and read its reply, whole, whatever cancels the
        caller: a request whose reply stayed unread (or half read) would hand every later
        caller the previous one's answer, or a length read from the middle of a frame.

        The spawner answers at once (it only forks), but it is single-threaded: a request
        it is slow to check (a root on a hung mount) holds up everyone's. After
        ``SPAWNER_SILENT_SECONDS`` the caller is told so, and the reply it leaves behind is
        read, before anything is sent, by the next exchange, which also sweeps whatever
        that reply says was started for nobody. A request that cannot even be written
        means the spawner is wedged for good: its channel is closed."""
        reply: Spawned | None = None
        async with self._lock:
            with trio.CancelScope(shield=True):
                with trio.fail_after(SPAWNER_SILENT_SECONDS):
                    await self._read_owed_replies()
                written = False
                try:
                    with trio.fail_after(SPAWNER_SILENT_SECONDS):
                        if fds is not None:  # (fd 0 is an fd too)
                            await send_with_fd(self._control, data, fds)
                        else:
                            while data:
                                data = data[await self._control.send(data) :]
                        written = True
                        if sent is not None:
                            try:
                                sent()
                            except BaseException:  # its reply is still owed: read by the next exchange
                                self._owed.append(token)
                                raise
                        reply = await self._next_reply()
                except trio.TooSlowError:
                    if not written:
                        log.error("the spawner takes no requests any more; closing its channel")
                        self._control.close()
                        raise
                    log.warning("the spawner did not answer within %g s", SPAWNER_SILENT_SECONDS)
                    self._owed.append(token)
                    raise
        assert reply is not None
        return reply

    async def _next_reply(self) -> Spawned:
        """The spawner's next reply. Bytes read stay in ``_replies`` if this is cancelled."""
        while (body := self._next_body()) is None:
            data = await self._control.recv(65536)
            if not data:
                raise PeerGone
            self._replies.add(data)
        try:
            return _spawned_decoder.decode(body)
        except msgspec.DecodeError:  # nothing after this can be trusted to be in step
            self._control.close()
            raise PeerGone from None

    def _next_body(self) -> bytes | None:
        try:
            return self._replies.next()
        except ValueError:  # a length over the limit: the channel is out of step for good
            self._control.close()
            raise PeerGone from None

    async def _read_owed_replies(self) -> None:
        """Read the replies of requests whose callers stopped waiting; a command started
        for one of them is swept (its worker or zygote ends by itself: nobody holds the
        other end of its socket)."""
        while self._owed:
            reply = await self._next_reply()
            token = self._owed.pop(0)
            if reply.pid > 0 and token:
                sweep(self.spawner_pid, 0, token)
