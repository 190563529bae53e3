"""The egress process: the proxy of one command zygote, as the client, outside its
network namespace.

A zygote in proxy mode forks this process before it leaves the host's network, so the
process keeps the host's network and nothing else of the zygote's later layers; it
confines itself (``confine_egress``) and then serves two sockets:

- from its zygote, first the socket diagnostics of the commands' namespace
  (``EgressPeers``, see ``egress.peers``), then one ``EgressListen`` per command that
  connects, carrying a listening TCP socket the zygote made *inside* the command's
  network namespace (127.0.0.1, a free port): a socket keeps the namespace it was made
  in, so this process accepts the command's connections there and connects out here,
  serving only those the call's own cgroup made (other commands share that loopback).
  The zygote holds each listener until a connection waits on it, so a command that
  never connects costs this process nothing;
- to and from the protocol process (the runner): ``EgressAsk`` for each connection the
  rules leave open (the runner asks the person) and ``EgressUsed`` for a call's first
  connection the rules decide, each answered by ``EgressAnswer``;
  ``EgressRecord`` for each finished connection; ``EgressForget`` when the call is over,
  answered by ``EgressForgotten`` once its connections are closed and recorded.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import Annotated

import msgspec
import trio

from ..isolation.wire import FrameBuffer, SpawnRequest, close_fds, frame, receive_with_fds
from .peers import LoopbackPeers
from .proxy import Connection, Proxy
from .relay import Budget
from .rules import EgressRules

log = logging.getLogger(__name__)


#: Bounds on what the egress process says (it runs as the client: the runner decodes its
#: messages as untrusted, and a message past them is garbage that closes the link). A
#: record is cut to fit before it is sent.
_NAME_CHARS = 256
_TEXT_CHARS = 2048
Name = Annotated[str, msgspec.Meta(max_length=_NAME_CHARS)]
Text = Annotated[str, msgspec.Meta(max_length=_TEXT_CHARS)]
Count = Annotated[int, msgspec.Meta(ge=0)]
#: Calls forgotten before their listener came, remembered (see ``_forgotten_unseen``).
_FORGOTTEN_UNSEEN = 4096


class EgressListen(msgspec.Struct, frozen=True, kw_only=True, tag="egress_listen"):
    token: str  # the call's token
    budget: int  # bytes the call may move, both ways together
    cgroup: int = 0  # the call's cgroup (v2) id: a connection made elsewhere is closed; 0: not checked


class EgressPeers(msgspec.Struct, frozen=True, tag="egress_peers"):
    """Before any listener: the socket diagnostics of the commands' namespace (its fd
    beside), by which the egress process tells which cgroup a connection comes from."""


class EgressAsk(msgspec.Struct, frozen=True, kw_only=True, tag="egress_ask"):
    id: int
    token: Name
    host: Name
    port: int


class EgressAnswer(msgspec.Struct, frozen=True, kw_only=True, tag="egress_answer"):
    id: int
    allowed: bool
    why: str = ""


class EgressUsed(msgspec.Struct, frozen=True, kw_only=True, tag="egress_used"):
    """The call's first connection, decided here by the rules: its records are worth
    waiting for when it ends. Answered (``EgressAnswer``) once the runner has taken that
    in, allowed only while the call still runs: a connection that would go out after the
    runner took the call for one without connections would be in no result."""

    id: int
    token: Name


class EgressRecord(msgspec.Struct, frozen=True, kw_only=True, tag="egress_record"):
    """A finished connection as the egress process reports it: the protocol's
    ``Connection`` and the call's token, each field bounded, since the runner decodes it
    from a process that runs as the client."""

    token: Name
    host: Name
    port: int
    protocol: Name
    address: Name = ""
    allowed_by: Text = ""
    refused: Text = ""
    sent: Count = 0
    received: Count = 0


class EgressForget(msgspec.Struct, frozen=True, kw_only=True, tag="egress_forget"):
    token: str


class EgressForgotten(msgspec.Struct, frozen=True, kw_only=True, tag="egress_forgotten"):
    token: Name


FromRunner = EgressAnswer | EgressForget
ToRunner = EgressAsk | EgressUsed | EgressRecord | EgressForgotten
from_runner = msgspec.msgpack.Decoder(FromRunner)
to_runner = msgspec.msgpack.Decoder(ToRunner)
_from_zygote_decoder = msgspec.msgpack.Decoder(EgressListen | EgressPeers)


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send a command's HTTP clients through the proxy on ``port``."""
    url = f"http://127.0.0.1:{port}"
    socks = f"socks5h://127.0.0.1:{port}"
    names = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "ALL_PROXY": socks, "NO_PROXY": "localhost,127.0.0.1,::1"}
    return {**names, **{name.lower(): value for name, value in names.items()}}


class ProxyListener:
    """A listening socket on this namespace's loopback for one command's connections, and
    the environment that points the command's HTTP clients at it. It is handed to the
    egress process (``hand_over``), which accepts on it from outside the namespace; a
    command that did not start never hands it over (it would stay open there, served for
    a call nobody ends). A zygote makes the next command's listener while it waits for
    that command, and hands it over only once a connection waits in its backlog
    (``fileno`` is what it watches).

    It listens only once it serves a command (``serve``): made ahead, it is bound and
    refuses connections, so that no other command (of the zygote's, sharing its
    loopback) can leave one in its backlog to be served as the next command's, under that
    call's egress rules and answers."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._socket.bind(("127.0.0.1", 0))
            self.environment = proxy_environment(self._socket.getsockname()[1])
        except OSError:
            self._socket.close()
            raise
        self._listen: EgressListen | None = None

    def serve(self, request: SpawnRequest) -> dict[str, str]:
        """Listen for ``request``'s command: the environment it runs with."""
        self._socket.listen(64)  # connections made before the hand-over wait in the backlog
        self._listen = EgressListen(token=request.token, budget=request.egress_budget, cgroup=request.socket_cgroup)
        return {**request.env, **self.environment}

    def fileno(self) -> int:
        return self._socket.fileno()

    def hand_over(self, to_egress: socket.socket) -> None:
        assert self._listen is not None, "a listener serves a command before it is handed over"
        socket.send_fds(to_egress, [frame(self._listen)], [self._socket.fileno()])

    def close(self) -> None:
        """Our copy (the egress process holds its own once handed over)."""
        self._socket.close()


def listen_through_the_proxy(request: SpawnRequest, to_egress: socket.socket) -> SpawnRequest:
    """Hand a listener to an egress process that lives and dies with this process (a
    fresh child's): the request whose command will use it."""
    listener = ProxyListener()
    try:
        env = listener.serve(request)
        listener.hand_over(to_egress)
    finally:
        listener.close()
    return msgspec.structs.replace(request, env=env)


class _Call(msgspec.Struct):
    token: str
    scope: trio.CancelScope
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    records: list[EgressRecord] = msgspec.field(default_factory=list)  # not sent to the runner yet
    used: bool = False  # the runner knows the call made a connection
    proxy: Proxy | None = None  # once its listener is served
    listener: trio.SocketListener | None = None


class EgressServer:
    def __init__(self, zygote: socket.socket, runner: socket.socket, rules: EgressRules) -> None:
        self._zygote = zygote
        self._runner = trio.socket.from_stdlib_socket(runner)
        self._rules = rules
        self._allowed_networks = list(rules.allowed_networks)
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[tuple[bool, str]]]] = {}
        self._calls: dict[str, _Call] = {}
        self._send_lock = trio.Lock()
        self._zygote_gone = False
        #: Calls the runner forgot before their listener came: the two come on different
        #: sockets, so a listener can arrive after its command has ended (and been
        #: forgotten); it is then closed unserved. The oldest make room past the bound
        #: (a command that failed to start never hands its listener over).
        self._forgotten_unseen: dict[str, None] = {}
        self._peers: LoopbackPeers | None = None  # the commands' namespace's, from the zygote

    async def run(self) -> None:
        """Serve until the runner closes its end, or until the zygote (or the command's own
        child) is gone and every call has been forgotten: a fresh child waits for that
        before it exits, so that the records of its command's last connections go out."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._from_zygote)
            await self._from_runner()
            nursery.cancel_scope.cancel()

    def _end_if_done(self) -> None:
        if self._zygote_gone and not self._calls:
            self._nursery.cancel_scope.cancel()

    def _forgotten_before_listening(self, token: str) -> bool:
        """Whether the runner forgot ``token``'s call before its listener came (once)."""
        if token not in self._forgotten_unseen:
            return False
        del self._forgotten_unseen[token]
        return True

    async def _ask_runner(self, question: Callable[[int], EgressAsk | EgressUsed]) -> tuple[bool, str]:
        """Send ``question(id)`` and wait for the runner's answer to it."""
        ask_id = next(self._ids)
        event, answer = trio.Event(), list[tuple[bool, str]]()
        self._waiting[ask_id] = (event, answer)
        try:
            await self._send(question(ask_id))
            await event.wait()
        finally:
            self._waiting.pop(ask_id, None)
        return answer[0]

    async def _send(self, message: msgspec.Struct) -> None:
        async with self._send_lock:
            view = memoryview(frame(message))
            while view:
                view = view[await self._runner.send(view) :]

    async def _from_zygote(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._zygote)
            received = receive_with_fds(self._zygote)
            if received is None:  # the zygote is gone; calls already listening finish
                self._zygote_gone = True
                self._end_if_done()
                return
            body, fds = received
            try:
                listen = _from_zygote_decoder.decode(body)
            except msgspec.DecodeError:
                close_fds(fds)
                continue
            if isinstance(listen, EgressPeers):
                if len(fds) == 1 and self._peers is None:
                    self._peers = LoopbackPeers(socket.socket(fileno=fds[0]))
                else:
                    close_fds(fds)
                continue
            if len(fds) != 1 or self._forgotten_before_listening(listen.token):
                close_fds(fds)  # no listener; or the call is over: its backlog goes nowhere
                continue
            try:
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fds[0])))
            except (OSError, ValueError) as exc:  # not a listening TCP socket: that call has no proxy
                log.warning("the zygote handed over no listening socket for a call (%s)", exc)
                close_fds(fds)
                continue
            call = self._calls[listen.token] = _Call(listen.token, trio.CancelScope())  # known at once
            self._nursery.start_soon(self._serve_call, listen, call, listener)

    async def _serve_call(self, listen: EgressListen, call: _Call, listener: trio.SocketListener) -> None:
        token = listen.token

        async def decide(host: str, port: int) -> tuple[bool, str]:
            """The administrator's rules here, at once; a host they leave open goes to the
            protocol process (which may ask the person)."""
            judgement, why, _normal = self._rules.judge(host, port)
            if judgement == "ask":
                call.used = True
                return await self._ask_runner(lambda ask_id: EgressAsk(id=ask_id, token=token, host=host, port=port))
            if not call.used:  # the runner learns of it before the connection goes on
                running, not_running = await self._ask_runner(lambda ask_id: EgressUsed(id=ask_id, token=token))
                call.used = running
                if not running:
                    return False, not_running
            return judgement == "allow", why

        def record(connection: Connection) -> None:
            call.records.append(_record_of(token, connection))
            self._nursery.start_soon(self._flush, call)  # at once: the process may not outlive its call

        call.listener = listener
        from_the_call = self._from_cgroup(listen.cgroup)
        proxy = call.proxy = Proxy(decide, record, self._allowed_networks, Budget(listen.budget), from_the_call)
        try:
            with call.scope:
                async with listener:
                    await proxy.serve(listener)
        except Exception:  # this call's proxy ends; the other calls' go on
            log.exception("the egress proxy of a call failed; its listener is closed")
        finally:
            call.proxy = call.listener = None  # the proxy's closures hold the call: no cycle left behind
            call.done.set()

    def _from_cgroup(self, cgroup: int) -> Callable[[trio.socket.SocketType], bool] | None:
        """Whether a connection's other end was made in ``cgroup`` (the call's): another
        command of the zygote may have connected to this call's listener. None: every
        connection is the call's (a zygote that could not tell says so in its layers)."""
        peers = self._peers
        if not cgroup or peers is None:
            return None

        def made_there(connection: trio.socket.SocketType) -> bool:
            try:
                return peers.cgroup_of(connection.getpeername(), connection.getsockname()) == cgroup
            except OSError:  # the connection is gone already
                return False

        return made_there

    async def _from_runner(self) -> None:
        buffer = FrameBuffer()
        while data := await self._runner.recv(65536):
            for body in buffer.feed(data):
                try:
                    message = from_runner.decode(body)
                except msgspec.DecodeError:
                    continue
                if isinstance(message, EgressAnswer):
                    waiting = self._waiting.get(message.id)
                    if waiting is not None:
                        waiting[1].append((message.allowed, message.why))
                        waiting[0].set()
                else:
                    self._nursery.start_soon(self._forget, message.token)

    async def _forget(self, token: str) -> None:
        """End the call's connections, send their records, then ``EgressForgotten``. The
        call stays known until then: a process whose starter is gone ends once it knows
        no call, and ending earlier would lose the records on their way.

        Connections still open are waited for (each records itself as it closes). With
        none open the listener is closed here and the answer goes at once, while the
        cancelled proxy winds down: that takes the event loop a few rounds, and the
        runner (the call's result) waits for the answer."""
        call = self._calls.get(token)
        if call is not None:
            call.scope.cancel()
            if call.proxy is not None and call.listener is not None and not call.proxy.serving:
                call.listener.socket.close()  # new connections are refused from now on
            else:
                await call.done.wait()  # every connection of the call has recorded itself
            await self._flush(call)
        else:
            self._forgotten_unseen[token] = None
            if len(self._forgotten_unseen) > _FORGOTTEN_UNSEEN:
                del self._forgotten_unseen[next(iter(self._forgotten_unseen))]
        await self._send(EgressForgotten(token=token))
        self._calls.pop(token, None)
        self._end_if_done()

    async def _flush(self, call: _Call) -> None:
        """Send the call's records not sent yet, each once."""
        while call.records:
            await self._send(call.records.pop(0))


def _record_of(token: str, connection: Connection) -> EgressRecord:
    """The connection's record, each field cut to the bounds the runner holds it to (a
    host is whatever the command wrote in its request)."""
    return EgressRecord(
        token=token,
        host=_cut(connection.host, _NAME_CHARS),
        port=connection.port,
        protocol=_cut(connection.protocol, _NAME_CHARS),
        address=_cut(connection.address, _NAME_CHARS),
        allowed_by=_cut(connection.allowed_by, _TEXT_CHARS),
        refused=_cut(connection.refused, _TEXT_CHARS),
        sent=max(0, connection.sent),
        received=max(0, connection.received),
    )


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def serve(zygote: socket.socket, runner: socket.socket, rules: EgressRules) -> None:
    """The egress process's whole life: serve until the runner closes its end. It is
    forked from a child that gave its commands the default signal dispositions; a write
    to a connection whose command has gone must be an error here, not a ``SIGPIPE``
    that ends the proxy of every command of the zygote, records on their way and all."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        trio.run(EgressServer(zygote, runner, rules).run)
    finally:
        os._exit(0)
