"""The fork server: a single-threaded process, started before trio, that forks children.

It is started one of two ways: forked by ``toold serve`` (``start``), or as a process of
its own that protocol processes connect to (``serve_forever``, see ``spawner_socket``).

``start()`` forks it from the daemon's main process while that is still single-threaded
and has imported the tool modules, so each child costs about a fork. The spawner
reads ``SpawnRequest`` frames from a Unix socket, each with one fd attached (the write
end of the child's channel pipe), forks, and answers ``Spawned(pid)``. It ignores
SIGCHLD, so finished children are reaped by the kernel, and it is a child subreaper,
so anything a child leaves behind is reparented here rather than to init (and still
carries the call's ``TOOLD_CALL`` token for the sweep).
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import socket
import sys
import time
from typing import Any

import msgspec

from ..tools._base import Tool
from . import kernel
from .admission import Admission, Refused, check_cgroups, enable_credentials, receive_checked
from .cgroup import call_bases_of
from .child import run_child
from .confine import guarded_pids
from .prepare import Preparer
from .spawner_socket import accept_daemon
from .tempdirs import TempDirs
from .views import hide_other_users_processes
from .wire import Spawned, SpawnerMessage, SpawnRequest, TempDone, TempWanted, close_fds, frame

_request_decoder = msgspec.msgpack.Decoder(SpawnerMessage)
log = logging.getLogger("toold.spawner")
#: The spawner warms the tools (web_fetch's HTTP stack: about a fifth of a second, during
#: which it forks nothing) only after this long without a request: the daemon's start
#: sends the isolation probe first and a client's first call soon after; warming between
#: the two made that call wait for it.
QUIET_BEFORE_WARMING_S = 0.25
#: ... or this long after its first request, however busy: a client asking without pause
#: must not keep every later web_fetch (anyone's) from the warmed stack.
WARM_AT_LATEST_S = 5.0


def start(tools: list[Tool[Any]], admission: Admission | None = None) -> tuple[int, socket.socket]:
    """Fork the spawner; return its pid and the daemon's end of the control socket.
    ``admission``: whom and which roots it serves (default: only this process's uid)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    enable_credentials(theirs)  # before anything is sent: a message sent earlier has none
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        gc.enable()  # off in a daemon's start (see program), on in the spawner from now
        ours.close()
        code = 0
        try:
            # Without an admission: this process's own uid only (benchmarks, tools of our own).
            own = Admission(allowed_uids=(), allow_root_clients=os.geteuid() == 0, any_root=True)
            _serve(theirs, {tool.name: tool for tool in tools}, admission or own)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours


def _serve(control: socket.socket, tools: dict[str, Tool[Any]], admission: Admission) -> None:
    daemon_pid = os.getppid()
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != daemon_pid:
        return
    kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    hide_other_users_processes()
    serve_daemon(control, Preparer(tools), admission, daemon_pid)


def serve_forever(listener: socket.socket, tools: list[Tool[Any]], admission: Admission, peer_uid: int) -> None:
    """The spawner of its own (``toold spawner``): serve each protocol process of uid
    ``peer_uid`` that connects, one at a time, for as long as we run (a protocol process
    that restarts finds us again)."""
    kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    hide_other_users_processes()
    preparer = Preparer({tool.name: tool for tool in tools})
    while True:
        try:
            accepted = accept_daemon(listener, peer_uid)
        except OSError as exc:  # a connection that went away before it was accepted
            log.warning("accept failed: %s", exc)
            continue
        if accepted is None:
            continue
        control, daemon_pid = accepted
        with control:
            try:
                serve_daemon(control, preparer, admission, daemon_pid, listener=listener.fileno())
            except (OSError, ValueError) as exc:  # a broken peer loses its connection, not us
                log.warning("dropped the protocol process %d: %s", daemon_pid, exc)


def serve_daemon(
    control: socket.socket, preparer: Preparer, admission: Admission, daemon_pid: int, *, listener: int = -1
) -> None:
    """Serve one daemon (protocol process) until it closes its end of ``control``.
    ``listener``: a listening socket the children must not keep (the spawner of its own)."""
    my_pid = os.getpid()
    if kernel.seccomp_supported() is None:  # every child's filter, built once before the forks
        for sockets in ("any", "none"):
            kernel.seccomp_program(sockets=sockets, protected_pids=guarded_pids(my_pid, (daemon_pid,), zygote=False))
    temps = _LazyTemps(daemon_pid)  # used once the daemon has given up root
    peer = _Peer(pid=daemon_pid, cgroup_bases=call_bases_of(daemon_pid), listener=listener)
    try:
        _loop(control, preparer, admission, temps, peer)
    finally:
        temps.close()


class _Peer(msgspec.Struct, frozen=True):
    """The daemon a spawner serves: its pid (every request must come from it), where its
    call cgroups may be, and the spawner's own listening socket (closed in children)."""

    pid: int
    cgroup_bases: frozenset[str]
    listener: int = -1


class _LazyTemps:
    """The spawner's temp dirs, made on first use: a daemon that keeps its privileges
    makes its own and never asks."""

    def __init__(self, daemon_pid: int) -> None:
        self._daemon_pid = daemon_pid
        self._dirs: TempDirs | None = None

    def get(self) -> TempDirs:
        if self._dirs is None:
            self._dirs = TempDirs(os.geteuid(), self._daemon_pid, cleanup_stale=False)
        return self._dirs

    def close(self) -> None:
        if self._dirs is not None:
            self._dirs.close()


def _loop(control: socket.socket, preparer: Preparer, admission: Admission, temps: _LazyTemps, peer: _Peer) -> None:
    """Serve requests until the daemon closes its end."""
    my_pid = os.getpid()
    lent: dict[str, int] = {}  # temp dirs handed out -> their uid
    first_served: float | None = None  # when the first request was answered
    while True:
        if first_served is not None and warming_due(preparer.warmed, first_served, control):
            preparer.warm()
        first_served = first_served or time.monotonic()
        try:
            received = receive_checked(control, peer.pid)
        except Refused as exc:
            control.sendall(frame(Spawned(error=f"refused: {exc}")))
            continue
        if received is None:
            return  # the daemon closed its end
        body, fds = received
        try:
            message = _request_decoder.decode(body)
            if not isinstance(message, SpawnRequest):
                close_fds(fds)
                control.sendall(frame(_temp_chore(message, admission, temps, lent)))
                continue
            request = message
            admission.check(request)
            check_cgroups(request.cgroups, peer.cgroup_bases)
        except (msgspec.DecodeError, Refused) as exc:
            close_fds(fds)
            why = f"refused: {exc}" if isinstance(exc, Refused) else f"bad spawn request: {exc}"
            control.sendall(frame(Spawned(error=why)))
            continue
        # the channel (and a server's stderr), and in proxy mode, for a child that is not a
        # zygote (which makes its own), the link its egress process will talk to the daemon on
        expected = (2 if request.stdio else 1) + (1 if request.egress_proxy and not request.zygote else 0)
        if len(fds) != expected or (request.stdio and not request.argv):
            close_fds(fds)
            control.sendall(frame(Spawned(error=f"this spawn request carries exactly {expected} fd(s) and argv")))
            continue
        try:
            work = preparer.prepare(request)
        except (ValueError, msgspec.MsgspecError) as exc:
            close_fds(fds)
            control.sendall(frame(Spawned(error=f"cannot prepare the call: {exc}")))
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            close_fds(fds)
            control.sendall(frame(Spawned(error=f"fork failed: {exc.strerror}")))
            continue
        if pid == 0:
            control.close()
            if peer.listener >= 0:
                os.close(peer.listener)
            run_child(request, fds, work, my_pid, peer.pid)
        close_fds(fds)
        control.sendall(frame(Spawned(pid=pid)))


def _temp_chore(
    message: TempWanted | TempDone, admission: Admission, temps: _LazyTemps, lent: dict[str, int]
) -> Spawned:
    """Make or take back a call's temp dir, for admitted uids and dirs we handed out only."""
    if isinstance(message, TempWanted):
        if not admission.uid_allowed(message.uid, message.gid):
            return Spawned(error=f"refused: uid {message.uid} may not use this daemon")
        try:
            path = temps.get().take(message.uid, message.gid)
        except OSError as exc:
            return Spawned(error=f"no temp dir: {exc.strerror}")
        lent[path] = message.uid
        return Spawned(path=path)
    uid = lent.pop(message.path, None)
    if uid is None:
        return Spawned(error=f"refused: {message.path!r} is not a temp dir this spawner lent")
    temps.get().give_back(message.path, uid, reusable=message.reusable)
    return Spawned()


def warming_due(warmed: bool, first_served: float, control: socket.socket) -> bool:
    """Warm now: not yet warmed, and nothing asked for ``QUIET_BEFORE_WARMING_S`` (waited
    for here), or ``WARM_AT_LATEST_S`` gone since the first request whatever is asked."""
    if warmed:
        return False
    if time.monotonic() - first_served >= WARM_AT_LATEST_S:
        return True
    return not _waiting(control, QUIET_BEFORE_WARMING_S)


def _waiting(control: socket.socket, seconds: float = 0.0) -> bool:
    """Whether a request is there to be read, or comes within ``seconds``."""
    poller = select.poll()  # (select() refuses descriptors past 1024)
    poller.register(control.fileno(), select.POLLIN)
    return bool(poller.poll(round(seconds * 1000)))
