"""What the daemon does to itself at start, before it forks anything.

- A private umask (0077): every file and directory it or its helpers create (journal,
  its ``-wal``/``-shm``, locks, temp dirs) is its owner's alone.
- Not dumpable: the kernel then refuses other processes of the same uid (a tool) the
  daemon's ``/proc/PID/environ``, ``fd/``, ``mem`` and ptrace, and makes no core file.
  Forked children (the spawner, zygotes, workers) inherit this; an exec'd command does not.
- Secrets out of the environment: names that look like secrets are removed from
  ``os.environ`` and their values overwritten in the process's original environment
  block, which ``/proc/PID/environ`` shows whatever ``unsetenv`` did.
"""

from __future__ import annotations

import logging
import os
import re

from ..isolation import kernel
from ..sandbox.environment import is_secret

log = logging.getLogger(__name__)


def harden_process() -> list[str]:
    """Apply all three; return the names of the variables that were scrubbed."""
    os.umask(0o077)
    try:
        kernel.prctl(kernel.PR_SET_DUMPABLE, 0)
    except OSError as exc:  # never expected on Linux; say so rather than stop
        log.warning("could not make the daemon undumpable: %s", exc.strerror)
    return scrub_secrets()


def scrub_secrets() -> list[str]:
    names = [name for name in os.environ if is_secret(name)]
    for name in names:
        del os.environ[name]
    _overwrite_environment_block({name.encode() for name in names})
    return names


def _overwrite_environment_block(names: set[bytes]) -> None:
    """Replace ``NAME=value`` of each name in the initial environment block with ``NAME=``
    followed by NUL bytes (the block keeps its size)."""
    if not names:
        return
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[-3]), int(fields[-2])  # env_start, env_end (fields 50, 51)
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = bytearray(mem.read(end - start))
            for match in re.finditer(rb"([^\0=]+)=([^\0]*)", block):
                if match.group(1) in names:
                    block[match.start(2) : match.end(2)] = b"\0" * len(match.group(2))
            mem.seek(start)
            mem.write(bytes(block))
    except (OSError, ValueError, IndexError) as exc:
        log.warning("could not overwrite secrets in the environment block: %s", exc)
