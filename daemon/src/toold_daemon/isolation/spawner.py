"""The fork server: a single-threaded process, started before trio, that forks children.

``start()`` forks it from the daemon's main process while that is still single-threaded
and has imported the tool modules, so each child costs about a fork. The spawner
reads ``SpawnRequest`` frames from a Unix socket, each with one fd attached (the write
end of the child's channel pipe), forks, and answers ``Spawned(pid)``. It ignores
SIGCHLD, so finished children are reaped by the kernel, and it is a child subreaper,
so anything a child leaves behind is reparented here rather than to init (and still
carries the call's ``TOOLD_CALL`` token for the sweep).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any

import msgspec

from ..tools._base import Tool
from . import kernel
from .admission import Admission, Refused, enable_credentials, receive_checked
from .child import run_child
from .confine import guarded_pids
from .prepare import Preparer
from .tempdirs import TempDirs
from .wire import Spawned, SpawnerMessage, SpawnRequest, TempDone, TempWanted, close_fds, frame

_request_decoder = msgspec.msgpack.Decoder(SpawnerMessage)


def start(tools: list[Tool[Any]], admission: Admission | None = None) -> tuple[int, socket.socket]:
    """Fork the spawner; return its pid and the daemon's end of the control socket.
    ``admission``: whom and which roots it serves (default: only this process's uid)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    enable_credentials(theirs)  # before anything is sent: a message sent earlier has none
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
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
    my_pid = os.getpid()
    if kernel.seccomp_supported() is None:  # every child's filter, built once before the forks
        for sockets in ("any", "none"):
            kernel.seccomp_program(sockets=sockets, protected_pids=guarded_pids(my_pid, (daemon_pid,), zygote=False))
    preparer = Preparer(tools)
    temps = _LazyTemps(daemon_pid)  # used once the daemon has given up root
    try:
        _loop(control, preparer, admission, temps, pids=(my_pid, daemon_pid))
    finally:
        temps.close()


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


def _loop(
    control: socket.socket, preparer: Preparer, admission: Admission, temps: _LazyTemps, *, pids: tuple[int, int]
) -> None:
    """Serve requests until the daemon closes its end. ``pids``: (ours, the daemon's)."""
    my_pid, daemon_pid = pids
    lent: dict[str, int] = {}  # temp dirs handed out -> their uid
    while True:
        try:
            received = receive_checked(control, daemon_pid)
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
        except (msgspec.DecodeError, Refused) as exc:
            close_fds(fds)
            why = f"refused: {exc}" if isinstance(exc, Refused) else f"bad spawn request: {exc}"
            control.sendall(frame(Spawned(error=why)))
            continue
        expected = 2 if request.stdio else 1  # a server's stdio: its channel and its stderr
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
            run_child(request, fds, work, my_pid, daemon_pid)
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
