"""A zygote: one confined child that starts many commands of one kind by ``posix_spawn``.

Forking the spawner (a Python process) and confining the child costs several
milliseconds; for ``shell true`` that is most of the call. Commands of the same kind
(uid, roots, network) need exactly the same confinement, and every layer (identity,
namespaces, no_new_privs, rlimits, Landlock, seccomp) is inherited across fork and
exec. So the runner keeps one zygote per kind: a child confined once, which then starts
each command with ``posix_spawn`` in a new session (so the daemon can kill its group)
and watches it on a thread, writing the usual frames to the call's own channel.

The zygote carries no call token and is in no call's process group, so the kills and
sweeps of its calls never reach it. The runner moves it into a call's cgroup just for
the spawn, so the command starts inside that cgroup.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import NamedTuple

import msgspec

from .child import start_command, watch_command
from .wire import Outcome, Spawned, SpawnRequest, frame, receive_with_fds, write_frame

_decoder = msgspec.msgpack.Decoder(SpawnRequest)
_THREAD_STACK_BYTES = 512 * 1024  # the zygote lives under the calls' address-space limit


class _Started(NamedTuple):
    request: SpawnRequest
    channel: int
    pid: int
    pipes: dict[int, str]
    started: float


def serve(sock_fd: int, layers: dict[str, str]) -> None:
    """Announce the layers, then start commands until the runner closes the socket;
    returns once every command it started has been reported."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a call's reader may go away mid-write
    threading.stack_size(_THREAD_STACK_BYTES)
    write_frame(sock_fd, Outcome(ok=True, layers=layers))
    sock = socket.socket(fileno=sock_fd)
    watchers: list[threading.Thread] = []
    while (received := receive_with_fds(sock)) is not None:
        reply, command = _start(*received)
        sock.sendall(frame(reply))  # first: the runner waits for the pid, the watcher need not
        if command is not None:
            watchers = [t for t in watchers if t.is_alive()]
            _watch_on_a_thread(command, layers, watchers)
    for watcher in watchers:
        watcher.join()


def _start(body: bytes, fds: list[int]) -> tuple[Spawned, _Started | None]:
    try:
        request = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        _close(fds)
        return Spawned(error=f"bad command request: {exc}"), None
    if len(fds) != 1 or not request.argv:
        _close(fds)
        return Spawned(error="a command request carries argv and exactly one fd"), None
    channel = fds[0]
    os.set_inheritable(channel, False)  # the command must not get the channel
    started = time.monotonic()
    try:
        os.chdir(request.cwd or "/")
        pid, pipes = start_command(request, setsid=True)
    except OSError as exc:
        os.close(channel)
        return Spawned(error=f"cannot start {request.argv[0]}: {exc.strerror or exc}"), None
    return Spawned(pid=pid), _Started(request, channel, pid, pipes, started)


def _watch_on_a_thread(command: _Started, layers: dict[str, str], watchers: list[threading.Thread]) -> None:
    watcher = threading.Thread(target=_watch, args=(command, layers), daemon=True)
    try:
        watcher.start()
    except RuntimeError:  # no thread (RLIMIT_NPROC reached): the call ends without an outcome
        _reap(command.pid)
        _close([command.channel, *command.pipes])
    else:
        watchers.append(watcher)


def _watch(command: _Started, layers: dict[str, str]) -> None:
    try:
        outcome = watch_command(command.request, command.channel, command.pid, command.pipes, command.started)
        write_frame(command.channel, msgspec.structs.replace(outcome, layers=layers))
    except OSError:
        _reap(command.pid)  # the runner stopped reading (cancelled): it kills the group; we reap
    finally:
        os.close(command.channel)


def _reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _close(fds: list[int] | dict[int, str]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
