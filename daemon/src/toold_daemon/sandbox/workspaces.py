"""Per-session workspaces: which directory a client may make its session's only root.

A client names a workspace in ``hello``. It is accepted when, with symlinks resolved, it
lies inside one of the daemon's roots or inside a place ``[tools.sandbox] allowed_roots``
grants (an entry starting with ``~`` means the client's own home directory, from its
passwd entry, so one line serves every user). The lexical check happens here; whether
the client can really open it is proven by starting the client's worker on it (as the
client, under its confinement), which the service does next.
"""

from __future__ import annotations

import os
import pwd
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from ..config import Config
from . import Sandbox, build_sandbox

_CACHE_SIZE = 64


class WorkspaceRefused(Exception):
    """The workspace cannot be this client's (the message says why, for the client)."""


def home_of(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_dir or None
    except KeyError:
        return None


def allowed_places(config: Config, daemon_roots: Sequence[Path | str], uid: int) -> list[str]:
    """Where this uid may open a workspace (see ``allowed_places_for``)."""
    return allowed_places_for(config.tools.sandbox.allowed_roots, daemon_roots, uid)


def allowed_places_for(allowed_roots: Sequence[str], daemon_roots: Sequence[Path | str], uid: int) -> list[str]:
    """The daemon's roots and the ``allowed_roots`` entries (``~`` expanded to this uid's
    home; an entry for a uid without a home is skipped), each canonical."""
    places = [str(root) for root in daemon_roots]
    for entry in allowed_roots:
        place = entry
        if entry == "~" or entry.startswith("~/"):
            home = home_of(uid)
            if home is None:
                continue
            place = home + entry[1:]
        elif not entry.startswith("/"):
            continue  # "~user" and relative entries name nobody's place in particular
        places.append(os.path.realpath(place))
    return list(dict.fromkeys(places))


def inside(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")


class Workspaces:
    """Chooses and remembers the sandbox of each workspace (the same roots, patterns and
    flags as the daemon's own sandbox, with the workspace as the only root)."""

    def __init__(self, config: Config, daemon_sandbox: Sandbox) -> None:
        self.config = config
        self.daemon_sandbox = daemon_sandbox
        self._sandboxes: OrderedDict[tuple[str, bool], Sandbox] = OrderedDict()
        self._lock = threading.Lock()  # ``choose`` and ``settle`` run on threads (they look at disks)

    def choose(self, uid: int, workspace: str) -> Sandbox:
        """The sandbox for ``workspace`` as asked by ``uid``; raises WorkspaceRefused. An
        unprivileged daemon may not see into the place (a private home): then the path is
        resolved as far as it can see, and the client's worker settles it (``settle``)."""
        if not workspace.startswith("/"):
            raise WorkspaceRefused(f"a workspace must be an absolute path: {workspace!r}")
        if "\x00" in workspace:
            raise WorkspaceRefused("a workspace must not contain NUL bytes")
        real = os.path.realpath(workspace)  # symlinks resolved before the check
        self._check_place(uid, workspace, real)
        try:
            os.stat(real)
        except PermissionError:
            return self._sandbox(real, verified=False)
        except OSError:
            pass  # missing or not a directory: the sandbox says so
        return self._sandbox(real, verified=True)

    def settle(self, uid: int, sandbox: Sandbox, canonical: list[str]) -> Sandbox:
        """The sandbox again once the client's worker has resolved its roots as the client
        (they differ only where the daemon could not see); checked against the places."""
        if not canonical or canonical == [str(root) for root in sandbox.roots]:
            return sandbox
        for root in canonical:
            self._check_place(uid, root, root)
        return self._sandbox(canonical[0], verified=False)

    def _check_place(self, uid: int, asked: str, real: str) -> None:
        places = allowed_places(self.config, self.daemon_sandbox.roots, uid)
        if not any(inside(real, place) for place in places):
            shown = f" (resolved to {real})" if real != os.path.normpath(asked) else ""
            raise WorkspaceRefused(
                f"{asked}{shown} is outside the places this daemon allows workspaces: " + ", ".join(places)
            )

    def _sandbox(self, real: str, *, verified: bool) -> Sandbox:
        key = (real, verified)
        with self._lock:
            known = self._sandboxes.get(key)
            if known is not None:
                self._sandboxes.move_to_end(key)
                return known
        try:
            sandbox = build_sandbox(self.config, [Path(real)], verified=verified)
        except (OSError, ValueError) as exc:
            raise WorkspaceRefused(str(exc)) from None
        with self._lock:
            self._sandboxes[key] = sandbox
            while len(self._sandboxes) > _CACHE_SIZE:
                self._sandboxes.popitem(last=False)
        return sandbox
