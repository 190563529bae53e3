"""What a tool's processes see: the views mounted for commands over their roots, and the
/proc without other users' processes that the spawner mounts for every child.

A command runs in a mount namespace of its own, where each denied file below the roots
is covered by an empty stand-in, the protected locations (homes' dot-entries, what a
protected pattern names) are read-only, and the configured read-only paths (``.git``)
are bound over themselves read-only. One bounded walk of the roots finds what to cover
and what to protect; a layer whose walk could not see everything says ``partial``.
"""

from __future__ import annotations

import os

from ..sandbox.denied_tree import Found, find_denied
from ..sandbox.homes import home_directories, homes_within
from ..sandbox.paths import Sandbox
from . import kernel
from .other_spellings import identities, partial_because_folded, reached_by_other_spelling
from .wire import SpawnRequest


def mount_views(request: SpawnRequest, readonly: list[str], *, new_user_namespace: bool) -> dict[str, str]:
    """In a mount namespace of our own: cover each denied file below the roots with an
    empty stand-in (layer ``denied_files``); make the protected locations read-only (layer
    ``protected_paths``: homes but for their non-dot entries, and what matches a protected
    pattern); then bind each of ``readonly`` over itself read-only, so that commands can
    read ``.git`` but never plant a hook or rewrite its config (layer ``readonly_paths``).
    Every layer is off if the namespace is refused."""
    try:
        if new_user_namespace:
            kernel.unshare_as_same_uid(kernel.CLONE_NEWNS)
        else:
            kernel.unshare(kernel.CLONE_NEWNS)
        kernel.make_mounts_private()
    except OSError as exc:
        why = f"off: no mount namespace for commands ({exc.strerror})"
        return {"readonly_paths": why, "denied_files": why, "protected_paths": why}
    found = _find_below_roots(request)
    layers = {"denied_files": _hide_denied(request, found), "protected_paths": _protect(request, found, readonly)}
    if readonly:
        before = identities(readonly)
        try:
            for path in readonly:
                kernel.bind_read_only(path)
            names = sorted({os.path.basename(p) for p in readonly})
            layers["readonly_paths"] = f"on ({', '.join(names)} read-only for commands)"
            reached = reached_by_other_spelling(before)
            if reached:
                layers["readonly_paths"] = partial_because_folded(reached, f"of {len(readonly)} are writable,")
        except OSError as exc:
            layers["readonly_paths"] = f"off: read-only paths for commands refused ({exc.strerror})"
    return layers


#: Whether this spawner's children see a /proc without other users' processes (set once
#: in the spawner by ``hide_other_users_processes``, inherited by every child it forks).
_processes = ["off: the spawner did not make a /proc of its own"]


def hide_other_users_processes() -> str:
    """In the spawner, once: a mount namespace of its own (still receiving the host's new
    mounts) with a fresh /proc mounted ``hidepid=invisible``. Every child inherits it, so
    no tool process sees another uid's processes, their command lines or environments;
    the Landlock rules built here afterwards name this /proc. Mounting a proc instance
    needs privilege over the host's PID namespace: only a root spawner can."""
    if os.geteuid() != 0:
        _processes[0] = "off: a /proc of its own needs the spawner to run as root (other users' processes stay visible)"
        return _processes[0]
    try:
        kernel.unshare(kernel.CLONE_NEWNS)
        kernel.mount(None, "/", kernel.MS_REC | kernel.MS_SLAVE)
        kernel.mount(
            "proc", "/proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC, "proc", "hidepid=invisible"
        )
    except OSError as exc:
        _processes[0] = f"off: /proc could not be mounted anew ({exc.strerror})"
        return _processes[0]
    _processes[0] = "on (other users' processes are invisible)"
    return _processes[0]


def processes_report(uid: int) -> str:
    if uid == 0 and _processes[0].startswith("on"):
        return "off: the client is root"
    return _processes[0]


def _find_below_roots(request: SpawnRequest) -> Found:
    """One bounded walk of the roots for both the denied files and the protected entries."""
    if not request.roots:
        return Found()
    sandbox = Sandbox(
        request.roots,
        denied_patterns=request.hidden_patterns,
        protected_patterns=request.protected_patterns,
        verified=False,
    )
    return find_denied(sandbox, max_entries=request.hide_max_entries, protected=bool(request.protected_patterns))


def _hide_denied(request: SpawnRequest, found: Found) -> str:
    if not request.hidden_patterns:
        return "off: no denied patterns"
    if not request.roots:
        return "off: no roots"
    before = identities([*found.files, *found.directories])
    try:
        for path in found.files:
            kernel.hide_file(path)
        for path in found.directories:
            kernel.hide_directory(path)
    except OSError as exc:
        return f"off: a denied file could not be covered ({exc.strerror})"
    count = len(found.files) + len(found.directories)
    reached = reached_by_other_spelling(before)
    if reached:
        return partial_because_folded(reached, f"of {count} denied entries are")
    if not found.complete:
        return f"partial: {count} hidden; stopped after {request.hide_max_entries} entries (hide_denied_max_entries)"
    if found.unlisted:
        return (
            f"partial: {count} hidden; {len(found.unlisted)} directories may be passed through but not listed "
            f"(such as {found.unlisted[0]}): a denied file in them is not covered"
        )
    return f"on ({count} hidden when commands started)"


def _protect(request: SpawnRequest, found: Found, readonly: list[str]) -> str:
    """Homes at or below the roots read-only, each of their entries that is not a dot-entry
    bound writable again (so no dotfile can be created or changed there), then every
    protected entry the walk found read-only."""
    if not request.protected_patterns and not request.protect_homes:
        return "off: no protected locations"
    homes = homes_within(request.roots, home_directories()) if request.protect_homes else []
    covered = {*found.files, *found.directories}
    skip = set(readonly)
    shown = [p for p in found.protected if p not in skip and p not in covered]
    before = identities(shown)
    try:
        for home in homes:
            kernel.bind_read_only(home)
            with os.scandir(home) as entries:
                for entry in entries:
                    if entry.name.startswith(".") or entry.path in covered:
                        continue
                    if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                        kernel.bind_writable(entry.path)
        for path in shown:
            kernel.bind_read_only(path)
    except OSError as exc:
        return f"off: protected locations could not be made read-only ({exc.strerror})"
    reached = reached_by_other_spelling(before)
    if reached:
        return partial_because_folded(reached, f"of {len(shown)} protected entries are writable,")
    done = f"{len(homes)} home(s) and {len(shown)} protected entries read-only for commands"
    if not found.complete:  # a protected entry past the search is writable
        return f"partial: {done}; the search stopped after {request.hide_max_entries} entries (hide_denied_max_entries)"
    if found.unlisted:
        return (
            f"partial: {done}; {len(found.unlisted)} directories may be passed through but not listed "
            f"(such as {found.unlisted[0]}): a protected entry in them stays writable"
        )
    return f"on ({done})"
