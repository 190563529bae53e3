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
            import psutil  # only where /proc lacks children files: its import costs every start ~10 ms

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


def sweep_once(spawner_pid: int, leader_pid: int, token: str, killed: set[int]) -> int:
    """One pass: SIGKILL the group, then every spawner descendant carrying ``token`` that
    is not in ``killed`` yet (added to it). Returns how many new processes were found.

    A process with SIGKILL pending can no longer run or fork, so once a pass finds
    nothing new, everything the call started is dead or dying. Cheap: /proc is read only
    for the spawner's descendants."""
    if leader_pid > 0:  # 0 or less: no known leader (killpg(0) would hit our own group)
        try:
            os.killpg(leader_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    found = 0
    for pid in _descendants(spawner_pid):
        if pid in killed or _token_of(pid) != token:
            continue
        found += 1
        killed.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def sweep(spawner_pid: int, leader_pid: int, token: str, *, passes: int = 1000) -> int:
    """Repeat ``sweep_once`` until a pass finds nothing new; returns how many were killed."""
    killed: set[int] = set()
    for _ in range(passes):
        if sweep_once(spawner_pid, leader_pid, token, killed) == 0:
            break
    return len(killed)
