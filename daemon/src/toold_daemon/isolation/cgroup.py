"""Per-call cgroups, where the daemon may create them: cgroup v2, with cgroup v1
hierarchies for the limits v2 cannot give here.

A call's cgroup has one name (``call-<token>``) and one directory in each hierarchy we
use, under ``<hierarchy>/<the daemon's own cgroup>/toold-<daemon pid>/``. Its processes
join every one of them before anything else (the child as its first step; a zygote is
moved in, see ``Zygote.park``). The first hierarchy is the one that kills: with cgroup
v2, ``cgroup.kill`` reaches every process of the call wherever it went (new session,
cleared environment); on v1 the same is done by signalling every pid in ``cgroup.procs``
until none is left.

``pids.max`` and the memory limit apply in whichever hierarchy has the controller. On
hybrid systems (systemd's legacy layouts, many container hosts) the unified v2 hierarchy
often has neither, while v1 hierarchies for ``pids`` and ``memory`` are mounted; the
daemon then uses those next to v2. Without any writable hierarchy (unprivileged daemons
without systemd's ``Delegate=yes``) calls run without a cgroup, and the process-group
and token sweep is the only sweep; the layer report says which.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time
from collections.abc import Callable

import msgspec

LIMITED = ("pids", "memory")
_KILL_PASSES = 1000

#: Emptied call cgroups kept for later calls (``Cgroups.release``): making one costs
#: a mkdir and its limits in every hierarchy, removing it an rmdir in each, about
#: 170 µs of CPU per command here, where taking a kept one back costs its limit writes.
SPARE_CALL_CGROUPS = 16


class CgroupUnavailable(Exception):
    """A cgroup the daemon needed could not be made (the message says why)."""


class Hierarchy(msgspec.Struct, frozen=True):
    """Where our calls' cgroups live in one hierarchy, and which limits it enforces."""

    base: str  # <mount>/<own cgroup>/toold-<pid>
    version: int  # 2 (unified) or 1
    limits: frozenset[str] = frozenset()

    def limit_files(self, pids_max: int, memory_max: int) -> dict[str, str]:
        files: dict[str, str] = {}
        if "pids" in self.limits:
            files["pids.max"] = str(pids_max)
        if "memory" in self.limits:
            files["memory.max" if self.version == 2 else "memory.limit_in_bytes"] = str(memory_max)
        return files


class Cgroups(msgspec.Struct):
    """The hierarchies our calls' cgroups live in (none: ``reason`` says why)."""

    hierarchies: tuple[Hierarchy, ...] = ()
    reason: str = ""
    notes: list[str] = msgspec.field(default_factory=list)
    stale: list[str] = msgspec.field(default_factory=list)  # dead daemons' cgroups not removed yet
    #: Emptied call cgroups, for later calls. Taken in threads and given back on the loop:
    #: only ``list.append`` and ``list.pop``, each atomic.
    spare: list[str] = msgspec.field(default_factory=list)
    #: The ids of call cgroups' innermost cgroups in the unified hierarchy, the one a
    #: socket records its maker's cgroup in (see ``socket_id``, ``_innermost``). Written
    #: in threads, read on the loop: one dict item.
    socket_ids: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def base(self) -> str:
        """Where calls' cgroups are made in the hierarchy that kills ("" without cgroups)."""
        return self.hierarchies[0].base if self.hierarchies else ""

    @classmethod
    def detect(cls, enabled: bool = True) -> Cgroups:
        if not enabled:
            return cls(reason="off: per-call cgroups disabled by configuration")
        own = _own_cgroups()
        found: list[Hierarchy] = []
        notes: list[str] = []
        stale: list[str] = []
        unified = _unified(own.get("", ""), notes, stale)
        if unified is not None:
            found.append(unified)
        have = set(unified.limits) if unified else set()
        for controller in LIMITED:
            if controller in have:
                continue
            legacy = _legacy(controller, own.get(controller, ""), notes, stale)
            if legacy is not None:
                found.append(legacy)
                have.add(controller)
        if not found:
            return cls(reason="off: " + ("; ".join(notes) or "no cgroup hierarchy is mounted"), notes=notes)
        return cls(hierarchies=tuple(found), notes=notes, stale=stale)

    def remove_stale_again(self) -> bool:
        """One more try at the dead daemons' cgroups that outlived the start (no waiting):
        True once none is left."""
        self.stale = [base for base in self.stale if not _remove_stale_base(base, seconds=0.0)]
        return not self.stale

    def describe(self) -> str:
        if not self.hierarchies:
            return self.reason
        first = self.hierarchies[0]
        kill = "cgroup.kill" if first.version == 2 else "v1: kill every pid in cgroup.procs"
        limits = [f"{name} (v{h.version})" for h in self.hierarchies for name in sorted(h.limits)]
        return f"on (per-call cgroups under {first.base}; {kill}; limits: {', '.join(limits) or 'none'})"

    def paths(self, name: str) -> list[str]:
        """Where the processes of call cgroup ``name`` are, in every hierarchy (what a
        process joins): in the unified hierarchy, its innermost cgroup (``_innermost``)."""
        if not name:
            return []
        return [
            os.path.join(h.base, name, name) if h.version == 2 else os.path.join(h.base, name) for h in self.hierarchies
        ]

    def dirs(self, name: str) -> list[str]:
        """Call cgroup ``name`` itself in every hierarchy: where its limits are, and what
        its kill and its removal take (with everything inside)."""
        return [os.path.join(h.base, name) for h in self.hierarchies] if name else []

    def _innermost(self, name: str) -> bool:
        """Make call cgroup ``name``'s innermost cgroup in the unified hierarchy anew (its
        processes' cgroup there, without controllers: the limits are its parent's), and
        note its id. A kept cgroup keeps its id, and a socket carries the id of the cgroup
        its maker was in: a socket made during an earlier call, and handed to a process
        that outlived it, would pass as a later call's (``egress.peers``). Each use gets a
        cgroup of its own, ids never repeat. False if it could not be made."""
        for hierarchy in self.hierarchies:
            if hierarchy.version != 2:
                continue
            path = os.path.join(hierarchy.base, name, name)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(path)  # the last call's, emptied
                os.mkdir(path, 0o755)
                self.socket_ids[name] = os.stat(path).st_ino  # a cgroup's id is its inode number
            except OSError:
                self.socket_ids.pop(name, None)
                return False
        return True

    def create(self, name: str, *, pids_max: int, memory_max: int) -> str:
        """A fresh cgroup (``call-<token>`` for one call, ``zygote-<token>`` for a zygote's
        home) in every hierarchy, with the limits: its name, or "" without cgroups.

        Raises ``CgroupUnavailable`` when the daemon has cgroups but this one cannot be
        made whole (a directory, or a limit, refused): nothing may then run as though it
        had it. (A zygote whose home could not be made, because its name was taken, ran
        every command outside any call's cgroup: no limits, no cgroup kill.)"""
        if not self.hierarchies:
            return ""
        made: list[str] = []
        try:
            for hierarchy in self.hierarchies:
                path = os.path.join(hierarchy.base, name)
                os.mkdir(path, 0o755)
                made.append(path)
                for file, value in hierarchy.limit_files(pids_max, memory_max).items():
                    _write_or_raise(os.path.join(path, file), value)
        except OSError as exc:
            for done in reversed(made):
                _rmdir(done)
            raise CgroupUnavailable(f"cgroup {name} could not be made: {exc.strerror or exc}") from None
        if not self._innermost(name):
            self.remove(name)
            raise CgroupUnavailable(f"cgroup {name} could not be made: no innermost cgroup in the unified hierarchy")
        return name

    def socket_id(self, name: str) -> int:
        """The id that the sockets made in call cgroup ``name`` carry (the kernel records
        the unified hierarchy's cgroup of the process that makes a socket), or 0 when our
        cgroups have no unified hierarchy: every socket would then carry the same one."""
        return self.socket_ids.get(name, 0)

    def call_group(self, *, pids_max: int, memory_max: int, new_id: bool = True) -> str:
        """A call cgroup with these limits: an emptied one kept from an earlier call, its
        limits written again, else a fresh ``call-<random>`` (see ``create``). ``new_id``:
        a kept one's innermost cgroup is made anew (``_innermost``), for calls whose
        connections are told apart by it; 49 µs here, which the others need not pay."""
        while self.spare:
            try:
                name = self.spare.pop()
            except IndexError:  # taken meanwhile by another thread
                break
            if self._limit(name, pids_max, memory_max) and (not new_id or self._innermost(name)):
                return name
            self.remove(name)
        return self.create(f"call-{secrets.token_hex(12)}", pids_max=pids_max, memory_max=memory_max)

    def release(self, name: str) -> bool:
        """The call that had cgroup ``name`` is over: keep it for a later call once no
        process is left in it (while fewer than ``SPARE_CALL_CGROUPS`` are kept), else
        remove it. False while processes are still leaving it: try again.

        A kept cgroup starts its next call with nothing of the last one but what the
        kernel still charges to it (the page cache that call's files left, which the
        memory limit reclaims first) and its counters. Nothing a command runs can write
        to it in between: cgroup files are root's, and Landlock keeps /sys out of reach."""
        if len(self.spare) >= SPARE_CALL_CGROUPS:
            return self.remove(name)
        try:
            holding = {*self.dirs(name), *self.paths(name)}
            if any(_read(os.path.join(path, "cgroup.procs")).strip() for path in holding):
                return False
            # A cgroup made inside it (by a command that could write there: root without
            # Landlock) may hold processes its own list does not show; rmdir waits for them.
            if self._made_inside(name):
                return self.remove(name)
        except OSError:  # gone, or not a cgroup: nothing to keep
            return self.remove(name)
        self.spare.append(name)
        return True

    def _made_inside(self, name: str) -> bool:
        """Whether a cgroup besides its innermost one was made inside call cgroup ``name``
        (a directory's link count tells without listing it). Raises ``OSError`` if gone."""
        for hierarchy, path in zip(self.hierarchies, self.dirs(name), strict=True):
            innermost = 1 if hierarchy.version == 2 else 0
            if os.stat(path).st_nlink > 2 + innermost:
                return True
            if innermost and os.stat(os.path.join(path, name)).st_nlink > 2:
                return True
        return False

    def _limit(self, name: str, pids_max: int, memory_max: int) -> bool:
        """Write the limits of cgroup ``name`` again; False if one was refused."""
        try:
            for hierarchy, path in zip(self.hierarchies, self.dirs(name), strict=True):
                for file, value in hierarchy.limit_files(pids_max, memory_max).items():
                    _write_or_raise(os.path.join(path, file), value)
        except OSError:
            return False
        return True

    def limit_pids(self, name: str, pids_max: int) -> None:
        """Set cgroup ``name``'s process limit (where a hierarchy enforces one)."""
        for hierarchy, path in zip(self.hierarchies, self.dirs(name), strict=True):
            if "pids" in hierarchy.limits:
                _write(os.path.join(path, "pids.max"), str(pids_max))

    def open_procs(self, name: str) -> list[int] | None:
        """``cgroup.procs`` of cgroup ``name`` in every hierarchy, opened for writing (the
        move itself, which may wait milliseconds in the kernel, is the caller's)."""
        if not name:
            return None
        opened: list[int] = []
        try:
            for path in self.paths(name):
                opened.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in opened:
                os.close(fd)
            return None
        return opened

    def kill(self, name: str, *, spare: int = 0) -> bool:
        """SIGKILL every process in cgroup ``name`` (but ``spare``): ``cgroup.kill`` (v2,
        Linux 5.14), else each pid in ``cgroup.procs`` until a pass finds none new. False
        when neither works."""
        if not name or not self.hierarchies:
            return False
        path = self.dirs(name)[0]
        if not spare and self.hierarchies[0].version == 2 and _write(os.path.join(path, "cgroup.kill"), "1"):
            return True
        return kill_listed(path, spare=spare)

    def remove(self, name: str) -> bool:
        """Remove an emptied cgroup everywhere; False while processes are still leaving it."""
        removed = all([_rmdir(path) for path in self.dirs(name)])
        if removed:
            self.socket_ids.pop(name, None)
        return removed

    def keep_unified_only(self) -> None:
        """Give up the cgroup v1 hierarchies (remove their bases): an unprivileged process
        can create cgroups in a delegated v1 base but cannot move another user's process
        between them, so calls would end up sharing them. Limits then come from v2 where
        it delegates them (and from rlimits)."""
        for hierarchy in self.hierarchies:
            if hierarchy.version == 1:
                _rmdir(hierarchy.base)
                self.notes.append(f"v1 {', '.join(sorted(hierarchy.limits))} given up by the unprivileged daemon")
        self.hierarchies = tuple(h for h in self.hierarchies if h.version == 2)

    def remove_bases(self) -> None:
        """Remove the kept call cgroups, then our bases (once every call's is gone)."""
        while self.spare:
            self.remove(self.spare.pop())
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                os.rmdir(hierarchy.base)


def join(paths: list[str]) -> bool:
    """Move the calling process into the call's cgroup in every hierarchy (in the child,
    before anything); True when it joined the first (the one that kills)."""
    joined = [_write(os.path.join(path, "cgroup.procs"), "0") for path in paths]
    return bool(joined) and joined[0]


def kill_listed(path: str, *, spare: int = 0) -> bool:
    """SIGKILL every pid listed in ``path``'s ``cgroup.procs``, and in those of cgroups
    made inside it (but ``spare``), again until a pass finds none new (a process with
    SIGKILL pending cannot fork any more)."""
    killed: set[int] = set()
    procs = os.path.join(path, "cgroup.procs")
    for _ in range(_KILL_PASSES):
        try:
            pids = {int(word) for word in _read(procs).split()}
        except OSError:
            return bool(killed)
        pids |= {int(word) for inner in _inner_cgroups(path) for word in _listed(inner).split()}
        new = pids - killed - {spare}
        if not new:
            return True
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= new
    return True


def call_bases_of(pid: int) -> frozenset[str]:
    """Where the daemon with ``pid`` makes its calls' cgroups (``toold-<pid>`` below its
    own cgroup, in every hierarchy mounted here): the spawner lets its children join
    cgroups directly below these and nowhere else."""
    own = _own_cgroups(pid)
    bases: set[str] = set()
    for mount, root, fs, options in _mounts():
        keys = [""] if fs == "cgroup2" else [o for o in options.split(",") if o in own and o]
        for key in keys:
            parent = _inside(mount, root, own.get(key, ""))
            if parent:
                bases.add(os.path.join(parent, f"toold-{pid}"))
    return frozenset(bases)


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root within the hierarchy, fs type, super options) of cgroup mounts."""
    found: list[tuple[str, str, str, str]] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, fs = left.split(), right.split()
                if len(fields) > 4 and len(fs) > 2 and fs[0] in ("cgroup", "cgroup2"):
                    found.append((fields[4], fields[3], fs[0], fs[2]))
    except OSError:
        pass
    return found


def _own_cgroups(pid: int | None = None) -> dict[str, str]:
    """The cgroup of ``pid`` (default: ours) per controller from /proc/PID/cgroup (""
    keys the unified hierarchy)."""
    own: dict[str, str] = {}
    try:
        with open(f"/proc/{pid or 'self'}/cgroup") as f:
            for line in f:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    own[controller] = path
    except OSError:
        pass
    return own


def _inside(mount: str, root: str, own: str) -> str:
    """Our cgroup's directory under a mount of its hierarchy (which may show only a subtree)."""
    if not own:
        return ""
    if root == "/":
        relative = own
    elif own == root or own.startswith(root.rstrip("/") + "/"):
        relative = own[len(root) :]
    else:
        return ""  # this mount does not show our cgroup
    return os.path.join(mount, relative.lstrip("/"))


def _make_base(parent: str, notes: list[str], stale: list[str]) -> str:
    _remove_stale(parent, stale)
    base = os.path.join(parent, f"toold-{os.getpid()}")
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        notes.append(f"cannot create cgroups under {parent} ({exc.strerror}); Delegate=yes?")
        return ""
    return base


def _unified(own: str, notes: list[str], stale: list[str]) -> Hierarchy | None:
    for mount, root, fs, _options in _mounts():
        if fs != "cgroup2":
            continue
        parent = _inside(mount, root, own)
        if not parent or not os.path.isdir(parent):
            continue
        base = _make_base(parent, notes, stale)
        if not base:
            return None
        return Hierarchy(base=base, version=2, limits=_enable_controllers(parent, base))
    notes.append("no cgroup v2 hierarchy holds the daemon's cgroup")
    return None


def _legacy(controller: str, own: str, notes: list[str], stale: list[str]) -> Hierarchy | None:
    """A cgroup v1 hierarchy with ``controller``, where we can make cgroups."""
    for mount, root, fs, options in _mounts():
        if fs != "cgroup" or controller not in options.split(","):
            continue
        parent = _inside(mount, root, own)
        if not parent or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            continue
        base = _make_base(parent, notes, stale)
        if base and controller == "memory":
            _write(os.path.join(base, "memory.use_hierarchy"), "1")  # limits hold for what a call starts
        return Hierarchy(base=base, version=1, limits=frozenset({controller})) if base else None
    return None


def _remove_stale(parent: str, left: list[str]) -> None:
    """Cgroups left by daemons that were killed (their pid is gone). Those whose last
    processes are still exiting after a moment are added to ``left``, to try again
    later (``Cgroups.remove_stale_again``) rather than hold up the start."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name.removeprefix("toold-")
        if name == owner or not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        base = os.path.join(parent, name)
        if not _remove_stale_base(base, seconds=2.0):
            left.append(base)


def _remove_stale_base(base: str, *, seconds: float) -> bool:
    """Kill what runs in a dead daemon's cgroups and remove them: True once they are gone."""
    with contextlib.suppress(OSError):
        for call in os.listdir(base):
            if call.startswith(("call-", "zygote-", "worker-")):
                path = os.path.join(base, call)
                if _write(os.path.join(path, "cgroup.kill"), "1"):
                    _rmdir_when_empty(path, seconds)
                else:  # v1: a process may fork between listing and killing, so again
                    _rmdir_when_empty(path, seconds, kill=functools.partial(kill_listed, path))
    return _rmdir_when_empty(base, seconds, kill=functools.partial(kill_listed, base))


def _rmdir_when_empty(path: str, seconds: float = 2.0, kill: Callable[[], object] | None = None) -> bool:
    """Remove a cgroup whose processes were just killed: they leave it as they exit, a
    moment later, and until then rmdir fails with EBUSY. ``kill``: kill what is still
    listed, before each try (where the kernel cannot kill the whole cgroup at once)."""
    deadline = time.monotonic() + seconds
    while True:
        if kill is not None:
            kill()
        if _rmdir(path):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _enable_controllers(parent: str, base: str) -> frozenset[str]:
    """Best effort: delegate pids and memory to our calls' cgroups."""
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            available = set(f.read().split())
    except OSError:
        return frozenset()
    enabled: set[str] = set()
    for name in available & set(LIMITED):
        if _write(os.path.join(parent, "cgroup.subtree_control"), f"+{name}") and _write(
            os.path.join(base, "cgroup.subtree_control"), f"+{name}"
        ):
            enabled.add(name)
    return frozenset(enabled)


def write_procs(opened: list[int], pid: int) -> bool:
    """Move ``pid`` by writing it to each ``cgroup.procs`` ``Cgroups.open_procs`` opened,
    and close them; False if any write failed. May wait milliseconds in the kernel: the
    caller runs it off the event loop."""
    text = str(pid).encode()
    moved = True
    for fd in opened:
        try:
            os.write(fd, text)
        except OSError:
            moved = False
        finally:
            os.close(fd)
    return moved


def _write_or_raise(path: str, text: str) -> None:
    """One write to a cgroup file, opened as ``open(path, "w")`` would (a file in a
    plain directory standing in for a hierarchy is made). Plain system calls: Python's
    buffered file objects cost 20 µs where these cost 5, and a command writes several."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _listed(group: str) -> bytes:
    """``cgroup.procs`` of ``group``, or nothing if it cannot be read (gone meanwhile)."""
    try:
        return _read(os.path.join(group, "cgroup.procs"))
    except OSError:
        return b""


def _read(path: str) -> bytes:
    """All of a cgroup (or /proc) file, with plain system calls (see ``_write_or_raise``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _write(path: str, text: str) -> bool:
    try:
        _write_or_raise(path, text)
    except OSError:
        return False
    return True


def _rmdir(path: str) -> bool:
    """Remove cgroup ``path``, and any emptied cgroup made inside it (which only a command
    able to write there could make: root without Landlock) first; False while a
    process is still in one of them."""
    if _rmdir_one(path):
        return True
    inner = _inner_cgroups(path)
    for nested in inner:
        _rmdir_one(nested)
    return bool(inner) and _rmdir_one(path)


def _rmdir_one(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _inner_cgroups(path: str) -> list[str]:
    """The cgroups inside cgroup ``path``, the deepest first ([] for none: a directory's
    link count tells without listing it)."""
    try:
        if os.stat(path).st_nlink <= 2:
            return []
    except OSError:
        return []
    found = [os.path.join(parent, name) for parent, names, _files in os.walk(path) for name in names]
    return sorted(found, key=lambda nested: nested.count(os.sep), reverse=True)
