"""A zygote: one confined child that starts many commands of one kind by ``posix_spawn``.

Forking the spawner (a Python process) and confining the child costs several
milliseconds; for ``shell true`` that is most of the call. Commands of the same kind
(uid, roots, network) need exactly the same confinement, and every layer (identity,
namespaces, no_new_privs, rlimits, Landlock, seccomp) is inherited across fork and
exec. So the runner keeps one zygote per kind: a child confined once, which then starts
each command with ``posix_spawn`` in a new session (so the daemon can kill its group)
and watches all of them from one event loop (``Supervisor``), writing the usual frames
to each call's own channel. No thread per command: a zygote is one task, whatever runs.

In proxy mode each command gets a listener of its own for its proxy connections; the
zygote holds it (``HeldListener``, watched by the supervisor) and hands it to its egress
process only once a connection waits on it. The next command's listener is made while
the zygote waits for that command (``NextListener``), not between its request and its
start.

The zygote carries no call token and is in no call's process group, so the kills and
sweeps of its calls never reach it. It waits in the cgroup of the next call, so the
command starts inside it, and the runner moves it on right after the spawn
(``Zygote.park``).
"""

from __future__ import annotations

import os
import signal
import socket
import time

import msgspec

from ..egress.process import ProxyListener
from .command_start import start_command
from .roots import roots_identity
from .supervisor import Supervisor
from .wire import Outcome, Spawned, SpawnRequest, close_fds, frame, receive_with_fds, write_frame

_decoder = msgspec.msgpack.Decoder(SpawnRequest)
#: request, channel, pid, pipes, started at, the command's proxy listener
Started = tuple[SpawnRequest, int, int, dict[int, str], float, "HeldListener | None"]


def serve(
    sock_fd: int, layers: dict[str, str], roots: list[str], egress: tuple[socket.socket, socket.socket | None] | None
) -> None:
    """Announce the layers (with the runner's end of the link to the egress process, in
    proxy mode), then start commands until the runner closes the socket; returns once
    every command it started has been reported."""
    identity = roots_identity(roots)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a call's reader may go away mid-write
    sock = socket.socket(fileno=sock_fd)
    if egress is not None and egress[1] is not None:
        socket.send_fds(sock, [frame(Outcome(ok=True, layers=layers))], [egress[1].fileno()])
        egress[1].close()
    else:
        write_frame(sock_fd, Outcome(ok=True, layers=layers))
    to_egress = egress[0] if egress is not None else None
    proxied = NextListener(to_egress) if to_egress is not None else None
    supervisor = Supervisor(layers)
    supervisor.watch_other(sock_fd)
    listening = True
    while listening or supervisor.active:
        if proxied is not None and listening:
            proxied.prepare()
        for _ready in supervisor.step():
            received = receive_with_fds(sock)
            if received is None:  # retired: finish what runs, start nothing new
                supervisor.forget_other(sock_fd)
                listening = False
                continue
            reply, started = _start(*received, identity=identity, proxied=proxied)
            sock.sendall(frame(reply))  # first: the runner waits for the pid
            if started is not None:
                request, channel, pid, pipes, at, listener = started
                supervisor.add(request, channel, pid, pipes, at, listener=listener)
    if proxied is not None:
        proxied.close()


def _start(
    body: bytes, fds: list[int], *, identity: tuple[tuple[int, int], ...], proxied: NextListener | None
) -> tuple[Spawned, Started | None]:
    try:
        request = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        close_fds(fds)
        return Spawned(error=f"bad command request: {exc}"), None
    if roots_identity(request.roots) != identity:
        close_fds(fds)
        return Spawned(error="the workspace's directories were replaced since its commands started", stale=True), None
    if len(fds) != 1 or not request.argv:
        close_fds(fds)
        return Spawned(error="a command request carries argv and exactly one fd"), None
    channel = fds[0]
    os.set_inheritable(channel, False)  # the command must not get the channel
    started = time.monotonic()
    listener = None
    env = request.env
    try:
        os.chdir(request.cwd or "/")
        if proxied is not None and request.egress_proxy:
            listener, env = proxied.take(request)
        pid, pipes = start_command(request, setsid=True, env=env)
    except OSError as exc:
        os.close(channel)
        if listener is not None:  # a command that did not start never hands its listener over
            listener.close()
        return Spawned(error=f"cannot start {request.argv[0]}: {exc.strerror or exc}"), None
    return Spawned(pid=pid), (request, channel, pid, pipes, started, listener)


class HeldListener:
    """A started command's proxy listener, kept here until a connection waits on it (see
    ``Supervisor``): then the egress process takes it. One the egress process cannot take
    (it is gone) is closed, and the command's connections are refused: it has no way out."""

    def __init__(self, listener: ProxyListener, to_egress: socket.socket) -> None:
        self._listener = listener
        self._to_egress = to_egress

    def fileno(self) -> int:
        return self._listener.fileno()

    def hand_over(self) -> bool:
        try:
            self._listener.hand_over(self._to_egress)
        except OSError:
            return False
        finally:
            self._listener.close()
        return True

    def close(self) -> None:
        self._listener.close()


class NextListener:
    """The proxy listener of the next command, made while the zygote waits for it: a
    socket and its bind, which would otherwise lie between a command's request and its
    start. It listens only once it is taken (``ProxyListener.serve``)."""

    def __init__(self, to_egress: socket.socket) -> None:
        self._to_egress = to_egress
        self._next: ProxyListener | None = None

    def prepare(self) -> None:
        if self._next is None:
            try:
                self._next = ProxyListener()
            except OSError:
                pass  # made when the command comes, and then its failure is the command's

    def take(self, request: SpawnRequest) -> tuple[HeldListener, dict[str, str]]:
        """The listener for ``request``'s command and the environment it runs with."""
        listener, self._next = self._next, None
        if listener is None:
            listener = ProxyListener()
        try:
            env = listener.serve(request)
        except OSError:
            listener.close()
            raise
        return HeldListener(listener, self._to_egress), env

    def close(self) -> None:
        if self._next is not None:
            self._next.close()
            self._next = None
