"""Whether per-call cgroups (v2) could be used here. Not used yet: reported only.

A per-call cgroup would give ``pids.max``, ``memory.max`` and ``cgroup.kill``. It needs a
cgroup v2 hierarchy the daemon may write (systemd ``Delegate=yes``, or root with the
unified hierarchy mounted and controllers enabled).
"""

from __future__ import annotations

import os

UNIFIED = "/sys/fs/cgroup"


def status() -> str:
    controllers = os.path.join(UNIFIED, "cgroup.controllers")
    if not os.path.exists(controllers):
        return "off: no cgroup v2 unified hierarchy at /sys/fs/cgroup (cgroup v1 or hybrid)"
    try:
        with open("/proc/self/cgroup") as f:
            line = next((entry for entry in f if entry.startswith("0::")), "")
    except OSError:
        line = ""
    here = os.path.join(UNIFIED, line.strip()[3:].lstrip("/"))
    if not os.access(here, os.W_OK):
        return f"off: the daemon's cgroup {here} is not writable (run under systemd with Delegate=yes)"
    return "off: per-call cgroups are not implemented yet; the process-group and token sweep is used"
