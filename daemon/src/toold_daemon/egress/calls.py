"""The protocol process's side of the egress links: which call a connection belongs to,
the decision for each connection, and the records a call's result carries.

A proxy-mode zygote hands the runner one link to its egress process. Over it the egress
process asks about each connection the rules leave open (``EgressAsk``: the call's token,
host and port), says a call's first connection before it goes on (``EgressUsed``: answered
"no" once the call is over, so nothing goes out that no result records) and, when the
runner says the call is over (``EgressForget``), sends the records of the call's
connections and ``EgressForgotten``. Deciding is ``decide(call, host, port)``: the rules
first, then whoever may be asked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from ..isolation.wire import FrameBuffer, frame
from .process import EgressAnswer, EgressAsk, EgressForget, EgressForgotten, EgressRecord, EgressUsed, to_runner

log = logging.getLogger(__name__)
FORGET_SECONDS = 2.0
IDLE_FORGET_SECONDS = 1.0
_REGISTER_SECONDS = 2.0
#: Questions of one link that wait for their call's registration at once; past them a
#: question about an unknown call is refused at once (the egress process runs as the
#: client: tokens it makes up must not each hold a task here for ``_REGISTER_SECONDS``).
_WAITING_FOR_REGISTRATION = 64
_EARLY_TOKENS = 1024
#: Early messages kept in all (a few per call are real: the first connections of a call
#: whose registration is a moment behind).
_EARLY_MESSAGES = 4096
#: What arrives for a token not registered (yet) is kept this long: far longer than a
#: spawn's reply takes, and not forever (the records of a call whose forget timed out).
_EARLY_SECONDS = 10.0
#: Connections a call's result lists one by one; the rest are counted (``Omitted``), so
#: that a command looping over connections cannot grow the result, the journal row or
#: this process's memory without bound.
MAX_RECORDS = 500
#: What a link whose egress process is gone (or that was closed) raises.
_GONE = (OSError, trio.ClosedResourceError, trio.BrokenResourceError)


class Omitted(msgspec.Struct):
    """The connections of a call past ``MAX_RECORDS``, counted."""

    connections: int = 0
    refused: int = 0
    sent: int = 0
    received: int = 0

    def add(self, record: EgressRecord) -> None:
        self.connections += 1
        self.refused += bool(record.refused)
        self.sent += record.sent
        self.received += record.received


#: Hosts one call may have a person asked about at the same time; a connection to yet
#: another new host is refused while they are open (a command cannot flood the approvers).
MAX_OPEN_QUESTIONS = 4

Ask = Callable[[str, int], Awaitable[tuple[bool, str]]]


class _Question(msgspec.Struct):
    answered: trio.Event = msgspec.field(default_factory=trio.Event)
    answer: tuple[bool, str] = (False, "the question ended without an answer")


class EgressCall(msgspec.Struct):
    token: str
    link: trio.socket.SocketType
    context: Any  # the call's ToolContext (its ask_network, if a person can be asked)
    records: list[EgressRecord] = msgspec.field(default_factory=list)
    omitted: Omitted = msgspec.field(default_factory=Omitted)
    forgotten: trio.Event = msgspec.field(default_factory=trio.Event)
    asked: bool = False  # a connection was made (asked, or told as used): its records are worth waiting for
    over: bool = False  # the call is being forgotten: no further connection may go on
    questions: dict[tuple[str, int], _Question] = msgspec.field(default_factory=dict)  # open, by host and port
    #: A long-lived program's (an MCP server's ``mcp:NAME``): its records go to
    #: ``EgressCalls.on_server_record`` as they come, not into a result.
    server: str = ""

    async def ask_person(self, host: str, port: int, ask: Ask) -> tuple[bool, str]:
        """Have ``ask`` put ``host:port`` to the person, once for the connections that want
        it while the question is open (they share its answer; a later connection is asked
        again, as an answer counts once), and for at most ``MAX_OPEN_QUESTIONS`` hosts at
        a time."""
        key = (host, port)
        question = self.questions.get(key)
        if question is not None:
            await question.answered.wait()
            return question.answer
        if len(self.questions) >= MAX_OPEN_QUESTIONS:
            return False, (
                f"{host}:{port} was not asked about: this call already waits for answers about "
                f"{MAX_OPEN_QUESTIONS} other hosts"
            )
        question = self.questions[key] = _Question()
        try:
            question.answer = await ask(host, port)
            return question.answer
        finally:
            del self.questions[key]
            question.answered.set()


Decide = Callable[[EgressCall, str, int], Awaitable[tuple[bool, str]]]


class EgressCalls:
    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self._calls: dict[str, EgressCall] = {}
        self._locks: dict[int, trio.Lock] = {}
        #: Per link, calls that made no connection: their listeners are closed in one
        #: message a moment later, so a command without network costs no wake-up there.
        self._idle: dict[int, list[str]] = {}
        # A command may connect before the runner has registered its call (the spawn's
        # reply and the first connection race): what arrives for an unknown token waits
        # here, a little while, instead of being lost or refused. Per token: when its
        # first message came, and its messages (tokens in order of arrival).
        self._early: dict[str, tuple[float, list[msgspec.Struct]]] = {}
        self._early_count = 0
        self._arrived: dict[str, trio.Event] = {}
        self._waiting_for_registration: dict[int, int] = {}  # per link
        #: Per link being served: its frames read so far, and the nursery its asks run in.
        self._served: dict[int, tuple[FrameBuffer, trio.Nursery]] = {}
        #: Where a server's connection records go (the audit trail), each as it comes.
        self.on_server_record: Callable[[EgressCall, dict[str, Any]], None] | None = None

    def register(self, token: str, link: trio.socket.SocketType, context: Any, *, server: str = "") -> EgressCall:
        call = EgressCall(token, link, context, server=server)
        self._calls[token] = call
        for message in self._take_early(token):
            self._apply(call, message)
        arrived = self._arrived.pop(token, None)
        if arrived is not None:  # a connection of the call waits for it: said, whatever runs first
            call.asked = True
            arrived.set()
        return call

    async def forget(self, token: str, *, connected: bool = True) -> dict[str, Any]:
        """End the call's connections and return what its result says of them (waiting a
        moment for their records): ``network``, and ``network_omitted`` past ``MAX_RECORDS``
        (``result_data``); empty without connections. ``connected=False``: the command's
        zygote says its listener never went to the egress process, so there is no
        listener there to close (unless the egress process spoke of the call after all)."""
        self._take_early(token)
        call = self._calls.get(token)
        if call is None:
            return {}
        if not call.asked:
            # The egress process says a call connects before the connection goes anywhere,
            # so before the command could end: it may be waiting on the link, unread.
            self._read_now(call.link)
        if not call.asked:  # no connection: at most a listener to close, nothing to wait for
            self._calls.pop(token, None)
            if connected:
                self._idle.setdefault(id(call.link), []).append(token)
            return {}
        call.over = True
        try:
            with trio.move_on_after(FORGET_SECONDS):
                await self._send(call.link, EgressForget(token=token))
                await call.forgotten.wait()
        except _GONE:
            pass  # the egress process is gone: its connections went with it
        finally:
            self._calls.pop(token, None)
        return result_data(call)

    async def serve(self, link: trio.socket.SocketType) -> None:
        """Answer one egress process until it goes away (with its zygote). Nothing it sends
        or does may end the daemon."""
        try:
            async with trio.open_nursery() as nursery:
                self._served[id(link)] = (FrameBuffer(), nursery)
                nursery.start_soon(self._close_idle_listeners, link)
                await self._read(link)
                nursery.cancel_scope.cancel()
        except Exception:
            log.exception("an egress link failed; it is closed")
        finally:
            self._served.pop(id(link), None)
            self._waiting_for_registration.pop(id(link), None)
            self._locks.pop(id(link), None)
            self._idle.pop(id(link), None)
            link.close()
            for call in [c for c in self._calls.values() if c.link is link]:
                call.forgotten.set()  # nothing more will come for them

    async def _close_idle_listeners(self, link: trio.socket.SocketType) -> None:
        while True:
            await trio.sleep(IDLE_FORGET_SECONDS)
            tokens = self._idle.pop(id(link), [])
            try:
                for token in tokens:
                    await self._send(link, EgressForget(token=token))
            except _GONE:
                return

    async def _read(self, link: trio.socket.SocketType) -> None:
        try:
            while data := await link.recv(65536):
                self._feed(link, data)
        except _GONE:
            pass  # the egress process is gone
        except (msgspec.DecodeError, ValueError):
            log.warning("an egress process sent garbage; its link is closed")

    def _read_now(self, link: trio.socket.SocketType) -> None:
        """Take in what the link holds now, without waiting (beside ``_read``, which takes
        the rest when the loop gets to it)."""
        if id(link) not in self._served:
            return
        try:
            while data := os.read(link.fileno(), 65536):
                self._feed(link, data)
        except (BlockingIOError, OSError):
            pass  # nothing more now, or the link is gone (``_read`` sees it too)
        except (msgspec.DecodeError, ValueError):
            log.warning("an egress process sent garbage; its link is closed")
            link.close()

    def _feed(self, link: trio.socket.SocketType, data: bytes) -> None:
        buffer, nursery = self._served[id(link)]
        for body in buffer.feed(data):
            self._take(nursery, link, to_runner.decode(body))

    def _take(self, nursery: trio.Nursery, link: trio.socket.SocketType, message: msgspec.Struct) -> None:
        if isinstance(message, (EgressAsk, EgressUsed)):
            call = self._calls.get(message.token)
            if call is not None and call.link is link:
                call.asked = True  # now, not when the answer's task runs: a forget may come first
            nursery.start_soon(self._answer, link, message)
            return
        token = getattr(message, "token", "")
        call = self._calls.get(token)
        if call is None:
            # An answer to a forget comes after the call (the runner forgets only calls it
            # registered): one for a call already gone, such as the batched forgets of
            # calls without connections, would only take the room of real early messages.
            if not isinstance(message, EgressForgotten):
                self._keep_early(token, message)
            return
        self._apply(call, message)

    def _keep_early(self, token: str, message: msgspec.Struct) -> None:
        now = trio.current_time()
        while self._early:  # what waited too long belongs to no call that will come
            oldest = next(iter(self._early))
            if self._early[oldest][0] > now - _EARLY_SECONDS:
                break
            self._take_early(oldest)
        if self._early_count >= _EARLY_MESSAGES:
            return
        if token in self._early:
            self._early[token][1].append(message)
        elif len(self._early) < _EARLY_TOKENS:
            self._early[token] = (now, [message])
        else:
            return
        self._early_count += 1

    def _take_early(self, token: str) -> list[msgspec.Struct]:
        kept = self._early.pop(token, (0.0, []))[1]
        self._early_count -= len(kept)
        return kept

    def _apply(self, call: EgressCall, message: msgspec.Struct) -> None:
        if isinstance(message, EgressRecord) and call.server:
            if self.on_server_record is not None:  # a server's belong to no call: kept as they come
                self.on_server_record(call, record_data([message])[0])
        elif isinstance(message, EgressRecord):
            if len(call.records) < MAX_RECORDS:
                call.records.append(message)
            else:
                call.omitted.add(message)
        elif isinstance(message, EgressForgotten):
            call.forgotten.set()

    async def _answer(self, link: trio.socket.SocketType, ask: EgressAsk | EgressUsed) -> None:
        """Whether the connection may go on: only while its call runs (a call the runner
        has forgotten, or one of another link, gets no more connections), and for an
        ``EgressAsk`` only if the person (or a grant) says so."""
        waiting = self._waiting_for_registration
        if ask.token in self._idle.get(id(link), ()):
            pass  # forgotten a moment ago as a call without connections: refused at once
        elif ask.token not in self._calls and waiting.get(id(link), 0) < _WAITING_FOR_REGISTRATION:
            waiting[id(link)] = waiting.get(id(link), 0) + 1  # perhaps not registered yet: wait a moment
            try:
                arrived = self._arrived.setdefault(ask.token, trio.Event())
                with trio.move_on_after(_REGISTER_SECONDS):
                    await arrived.wait()
                self._arrived.pop(ask.token, None)
            finally:
                waiting[id(link)] -= 1
        call = self._calls.get(ask.token)
        if call is None or call.link is not link or call.over:  # another link's token, or a call ending
            allowed, why = False, "the call is not running"
        else:
            call.asked = True  # (so too if it was registered after the message came, before this ran)
            try:  # a first connection the rules decided only needs the call running
                if isinstance(ask, EgressAsk):
                    allowed, why = await self._decide(call, ask.host, ask.port)
                else:
                    allowed, why = True, ""
            except Exception as exc:  # a failure to decide is a refusal, never a hang
                log.exception("deciding on a connection failed")
                allowed, why = False, f"could not decide: {exc}"
        try:
            await self._send(link, EgressAnswer(id=ask.id, allowed=allowed, why=why))
        except _GONE:
            pass

    async def _send(self, link: trio.socket.SocketType, message: msgspec.Struct) -> None:
        lock = self._locks.setdefault(id(link), trio.Lock())
        async with lock:
            view = memoryview(frame(message))
            while view:
                view = view[await link.send(view) :]


def result_data(call: EgressCall) -> dict[str, Any]:
    """What a call's result says of its connections: ``network``, one entry each (the
    first ``MAX_RECORDS``), and ``network_omitted`` counting the others."""
    if not call.records:
        return {}
    data: dict[str, Any] = {"network": record_data(call.records)}
    if call.omitted.connections:
        data["network_omitted"] = msgspec.structs.asdict(call.omitted)
    return data


def record_data(records: list[EgressRecord]) -> list[dict[str, Any]]:
    """The records as a result's ``data["network"]``."""
    return [{k: v for k, v in msgspec.structs.asdict(r).items() if k != "token"} for r in records]
