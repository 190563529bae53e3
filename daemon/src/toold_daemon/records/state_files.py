"""Files in the state directory, touched at start while the daemon may still be root.

With ``[daemon] user`` the protocol process owns the state directory once it has
dropped root. A compromised one could leave a symbolic link there (``journal.lock`` ->
``/etc/shadow``) for the next start, as root, to open, chmod or write through. So at
start every such file that is a symbolic link is refused, with the reason, and files
written at start are created anew (``O_EXCL | O_NOFOLLOW``) and renamed into place.
"""

from __future__ import annotations

import os
from pathlib import Path


class StateFileRefused(Exception):
    """A file of the state directory is not what the daemon left there."""


def refuse_links(*paths: Path) -> None:
    for path in paths:
        if path.is_symlink():
            raise StateFileRefused(
                f"{path} is a symbolic link, which the daemon never makes there; refusing to use it "
                "(remove it after checking who made it)"
            )


def replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole: a fresh temporary file (never through a link), then a rename."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)  # a link is removed, not followed
    write_through(temporary, path, data)


def write_through(temporary: Path, path: Path, data: bytes) -> None:
    """``data`` into ``temporary``, which must not exist yet (so nothing planted there, a
    link or a file another process holds open, is written through), then renamed to
    ``path``; on any failure the temporary file is removed."""
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
