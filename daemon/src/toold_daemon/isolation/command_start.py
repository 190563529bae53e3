"""Starting a command: the call's files written, then argv spawned with fresh stdout and
stderr pipes, under the client's umask (used by a supervising child and by zygotes)."""

from __future__ import annotations

import os
import signal

from .wire import SpawnRequest


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
        own_umask = os.umask(request.umask)  # the command's files get the client's modes
        try:
            pid = os.posix_spawn(
                request.argv[0],
                request.argv,
                request.env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, out_w, 1),
                    (os.POSIX_SPAWN_DUP2, err_w, 2),
                ],
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD),
                setsigmask=(),
                setsid=setsid,
            )
        finally:
            os.umask(own_umask)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, {out_r: "stdout", err_r: "stderr"}
