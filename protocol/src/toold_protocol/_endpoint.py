"""Where a daemon listens by default, computed the same way by daemon and clients.

The daemon picks its runtime directory with platformdirs; clients must not depend
on platformdirs, so the rule is restated here with the standard library, and a test
checks that both agree.
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "toold.sock"
ENDPOINT_ENV = "TOOLD_ENDPOINT"


def default_runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/toold`` (or ``/run/user/UID/toold``), falling back to
    ``/tmp/toold-UID`` when that base directory does not exist (containers, su)."""
    uid = os.getuid()
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}")
    if base.is_dir():
        return base / "toold"
    return Path(f"/tmp/toold-{uid}")


def default_endpoint() -> str:
    """``$TOOLD_ENDPOINT`` if set, else ``ipc://`` + the default socket file."""
    return os.environ.get(ENDPOINT_ENV) or f"ipc://{default_runtime_dir() / SOCKET_NAME}"
