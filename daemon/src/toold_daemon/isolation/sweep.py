"""Killing everything a call started, including what escaped its process group.

The child is a session and process-group leader, so ``killpg`` reaches everything that
stayed in the group. A process that called ``setsid`` (or ``nohup ... &`` under a shell
with job control) left it; it still carries the call's ``TOOLD_CALL`` token in its
environment, and once its parent dies it is reparented to the spawner (a child
subreaper). So the sweep kills the group, then walks the spawner's descendants and kills
every one with the token, repeating until a pass finds nothing.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

TOKEN_VARIABLE = "TOOLD_CALL"  # noqa: S105 - a variable name, not a secret


def _children(pid: int) -> list[int]:
    """Direct children, from /proc/PID/task/*/children when the kernel has it (fast)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(x) for x in f.read().split())
        except OSError:
            return [p.pid for p in psutil.Process(pid).children()] if psutil.pid_exists(pid) else []
    return found


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    stack = _children(pid)
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(_children(child))
    return out


def _token_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    prefix = TOKEN_VARIABLE.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def sweep(spawner_pid: int, leader_pid: int, token: str, *, passes: int = 100) -> int:
    """Kill the call's group and every descendant of the spawner carrying ``token``.
    Returns how many escaped processes were killed by token. Blocking (run in a thread)."""
    killed = 0
    for _ in range(passes):
        try:
            os.killpg(leader_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        victims = [pid for pid in _descendants(spawner_pid) if _token_of(pid) == token]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        if not victims and not _group_alive(leader_pid):
            return killed
        time.sleep(0.005)
    return killed
