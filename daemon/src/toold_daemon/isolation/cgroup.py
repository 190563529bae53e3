"""Per-call cgroups (v2), where the daemon may create them.

Each call's child moves itself into ``<base>/toold-<daemon pid>/call-<token>`` before it
drops privileges. Killing the call then ends with ``cgroup.kill``, which reaches every
process of the call wherever it went (new session, cleared environment), and the
``pids.max``/``memory.max`` limits apply when those controllers are available to us.
Without a writable cgroup v2 hierarchy (cgroup v1 systems, unprivileged daemons without
systemd's ``Delegate=yes``) calls run without one, and the process-group and token
sweep is the only sweep; the layer report says which.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


def _cgroup2_mounts() -> list[str]:
    mounts: list[str] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    mounts.append(left.split()[4])
    except OSError:
        pass
    return mounts


def _own_path() -> str:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return "/"


@dataclass
class Cgroups:
    """The daemon's parent cgroup for calls, or why there is none (``base`` empty)."""

    base: str = ""
    reason: str = ""
    controllers: frozenset[str] = frozenset()

    @classmethod
    def detect(cls, enabled: bool = True) -> Cgroups:
        if not enabled:
            return cls(reason="off: per-call cgroups disabled by configuration")
        mounts = _cgroup2_mounts()
        if not mounts:
            return cls(reason="off: no cgroup v2 hierarchy is mounted")
        own = _own_path().lstrip("/")
        for mount in mounts:
            parent = os.path.join(mount, own)
            if not os.path.isdir(parent):
                continue
            _remove_stale(parent)
            base = os.path.join(parent, f"toold-{os.getpid()}")
            try:
                os.makedirs(base, exist_ok=True)
            except OSError as exc:
                return cls(reason=f"off: cannot create cgroups under {parent} ({exc.strerror}); Delegate=yes?")
            return cls(base=base, controllers=_enable_controllers(parent, base))
        return cls(reason="off: the daemon's own cgroup is not under a cgroup v2 mount")

    def describe(self) -> str:
        if not self.base:
            return self.reason
        limits = ", ".join(sorted(self.controllers & {"pids", "memory"})) or "no pids/memory controller"
        return f"on (per-call cgroups under {self.base}; cgroup.kill; limits: {limits})"

    def create(self, name: str, *, pids_max: int, memory_max: int) -> str:
        """A fresh cgroup (``call-<token>`` for one call, ``zygote-<id>`` for a zygote
        between spawns): its path, or "" when it cannot be made."""
        if not self.base:
            return ""
        path = os.path.join(self.base, name)
        try:
            os.mkdir(path, 0o755)
        except OSError:
            return ""
        if "pids" in self.controllers:
            _write(os.path.join(path, "pids.max"), str(pids_max))
        if "memory" in self.controllers:
            _write(os.path.join(path, "memory.max"), str(memory_max))
        return path

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.base)


def _remove_stale(parent: str) -> None:
    """Empty cgroups left by daemons that were killed (their pid is gone)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name.removeprefix("toold-")
        if name == owner or not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        base = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            for call in os.listdir(base):
                if call.startswith(("call-", "zygote-")):
                    kill(os.path.join(base, call))
                    remove(os.path.join(base, call))
            os.rmdir(base)


def _enable_controllers(parent: str, base: str) -> frozenset[str]:
    """Best effort: delegate pids and memory to our calls' cgroups."""
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            available = set(f.read().split())
    except OSError:
        return frozenset()
    wanted = available & {"pids", "memory"}
    enabled: set[str] = set()
    for name in wanted:
        if _write(os.path.join(parent, "cgroup.subtree_control"), f"+{name}") and _write(
            os.path.join(base, "cgroup.subtree_control"), f"+{name}"
        ):
            enabled.add(name)
    return frozenset(enabled)


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        return False
    return True


def join(path: str) -> bool:
    """Move the calling process into the cgroup at ``path`` (in the child, before anything)."""
    return bool(path) and _write(os.path.join(path, "cgroup.procs"), "0")


def move(pid: int, path: str) -> bool:
    """Move another process (a zygote) into the cgroup at ``path``."""
    return _write(os.path.join(path, "cgroup.procs"), str(pid))


def kill(path: str) -> bool:
    """SIGKILL every process in the call's cgroup (``cgroup.kill``, Linux 5.14); False
    when the kernel has no ``cgroup.kill`` or refused."""
    return _write(os.path.join(path, "cgroup.kill"), "1")


def remove(path: str) -> bool:
    """Remove an emptied call cgroup; False while processes are still leaving it."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
