"""A tool worker: one confined, long-lived child that runs Python tools, one call at a time.

Every built-in Python tool (reads, listings, glob, grep, writes, edits, patches, deletes,
moves, diff previews) runs here, never in the daemon: the worker has the client's uid,
no_new_privs, rlimits, a Landlock ruleset that reaches only the session's roots and the
interpreter, seccomp and no network. The userspace path checks still run first; the
kernel holds where they would fail.

A worker serves one kind (uid, gid, roots, configuration) and answers one request at a
time on its socket: ``SpawnRequest`` in, ``Chunk`` frames and one ``Outcome`` out. The
daemon keeps several per kind for concurrency and kills one whose call times out or is
cancelled (a Python function cannot be interrupted safely), so a hung tool never holds
a worker that another call would then wait for.
"""

from __future__ import annotations

import os
import signal
import socket

import msgspec

from ..sandbox import Sandbox
from .prepare import Work
from .roots import roots_identity
from .tool_run import run_tool
from .wire import Outcome, SpawnRequest, close_fds, receive_with_fds, request_limit, write_frame

_decoder = msgspec.msgpack.Decoder(SpawnRequest)


def serve(sock_fd: int, layers: dict[str, str], work: Work) -> None:
    """Announce the layers (or why this worker cannot serve its roots), then run calls
    until the daemon closes the socket."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # the daemon may go away mid-write
    refused = _unreachable_root(work)
    if refused:
        write_frame(sock_fd, Outcome(ok=False, error_code="WORKSPACE_REFUSED", error_message=refused))
        return
    assert isinstance(work.sandbox, Sandbox)
    roots = [str(root) for root in work.sandbox.roots]  # canonical, as the spawner resolved them
    write_frame(sock_fd, Outcome(ok=True, layers=layers, data={"roots": roots}))
    identity = roots_identity(roots)
    sock = socket.socket(fileno=sock_fd)
    limit = _request_limit(work)
    while True:
        received = receive_with_fds(sock, limit=limit, alone=True)  # one request at a time
        if received is None:
            return
        body, fds = received
        close_fds(fds)  # a call carries none
        if roots_identity(roots) != identity:  # a root made anew: our Landlock rules hold the old one
            write_frame(sock_fd, Outcome(ok=False, error_code=STALE, error_message="the workspace was made anew"))
            return
        write_frame(sock_fd, _answer(body, sock_fd, work))


#: The answer of a worker whose roots were removed and made again: it exits, and the call
#: goes to a fresh worker.
STALE = "WORKER_STALE"


def _request_limit(work: Work) -> int:
    """What one request may take: an undo's carries up to the batch's undo bound of
    saved contents, beside the largest arguments a tool of ours takes."""
    undo = work.config.journal.undo_max_bytes_per_batch if work.config is not None else 0
    arguments = max((tool.max_args_bytes or 0 for tool in work.tools.values()), default=0)
    return request_limit(undo, arguments)


def _unreachable_root(work: Work) -> str:
    """Why this worker, as the client, cannot open one of its roots ("" when it can)."""
    if isinstance(work.sandbox, str) or work.sandbox is None:
        return f"the workspace is not usable: {work.sandbox or 'no configuration'}"
    for root in work.sandbox.roots:
        try:
            os.close(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as exc:
            return f"uid {os.getuid()} cannot open {root}: {exc.strerror}"
    return ""


def _answer(body: bytes, sock_fd: int, work: Work) -> Outcome:
    try:
        request = _decoder.decode(body)
        tool = work.tools.get(request.tool)
        if tool is None:
            return Outcome(ok=False, error_type="UnknownTool", error_code="UNKNOWN_TOOL", error_message=request.tool)
        args = msgspec.msgpack.decode(request.args, type=tool.args_type)
    except (msgspec.MsgspecError, ValueError) as exc:
        return Outcome(ok=False, error_type="BadArgs", error_code="BAD_REQUEST", error_message=str(exc)[:300])
    call = Work(tool, args, work.config, work.sandbox, "", work.tools)
    # New files get the client's modes (one call at a time here); a tool that changes
    # nothing makes none, and is spared the two system calls.
    own_umask = os.umask(request.umask) if tool.side_effecting else None
    try:
        return run_tool(request, sock_fd, call)
    except Exception as exc:  # a tool's bug ends that call, never the worker
        detail = f"{type(exc).__name__}: {exc}"[:300]
        return Outcome(ok=False, error_type="ExecutionFailed", error_code="TOOL_FAILED", error_message=detail)
    finally:
        if own_umask is not None:
            os.umask(own_umask)
