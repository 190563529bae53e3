"""Is a connecting process part of a tool call? Then it must not talk to the daemon.

A command that could connect to the daemon's socket could submit a call as its user and
approve it itself. Every process of a call descends from the spawner: it forks every
child, and as a child subreaper it inherits every orphan, so a double fork or a daemonised
grandchild stays below it. Where the daemon has call cgroups, membership is a second
sign that outlives the process tree. A process that vanishes before it can be checked is
refused: nothing proves it was not a tool.
"""

from __future__ import annotations

import os

_MAX_DEPTH = 4096
_ATTEMPTS = 3


def tool_process(pid: int, spawner_pid: int, cgroup_marker: str | None = None) -> str | None:
    """Why ``pid`` belongs to a tool call, or None when it does not."""
    for _attempt in range(_ATTEMPTS):
        try:
            if _descends_from(pid, spawner_pid):
                return f"process {pid} was started by a tool call"
            break
        except OSError:
            if not os.path.exists(f"/proc/{pid}"):
                return f"process {pid} exited before it could be checked"
            # an ancestor exited while we walked; the tree changed under us: walk again
    else:
        return f"the ancestry of process {pid} kept changing while it was checked"
    if cgroup_marker is not None and _in_cgroup(pid, cgroup_marker):
        return f"process {pid} is in a tool call's cgroup"
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    current = pid
    for _ in range(_MAX_DEPTH):
        if current == ancestor:
            return True
        if current <= 1:
            return False
        current = parent_of(current)
    return True  # a chain this long is not a real process tree: treat it as suspect


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        after_name = f.read().rsplit(b")", 1)[1].split()
    return int(after_name[1])  # state, ppid, ...


def _in_cgroup(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(marker in line for line in f)
    except OSError:
        return True
