"""Whether the daemon starts from compiled bytecode (``toold doctor``'s ``bytecode`` line).

A module without current bytecode beside it is compiled at every import, and where
Python may not write the result (a service under ``ProtectSystem=strict``, or
``PYTHONDONTWRITEBYTECODE`` set) at every start: the daemon's imports then take about
twice as long. The Debian package ships its bytecode and ``scripts/bootstrap`` compiles
the editable sources; this says when that did not happen.
"""

from __future__ import annotations

import importlib.util
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

_HEADER = struct.Struct("<4sIII")  # magic, flags, source mtime, source size (PEP 552)


def is_current(source: Path) -> bool:
    """Whether ``source`` has bytecode this interpreter will load without compiling."""
    try:
        with open(importlib.util.cache_from_source(str(source)), "rb") as cached:
            header = cached.read(_HEADER.size)
        stat = source.stat()
    except OSError:
        return False
    if len(header) < _HEADER.size:
        return False
    magic, flags, mtime, size = _HEADER.unpack(header)
    if magic != importlib.util.MAGIC_NUMBER:
        return False
    # flags: a hash-based file, checked against the source's hash by the import system
    return flags != 0 or (mtime, size) == (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)


def stale(sources: Iterable[Path]) -> list[Path]:
    """Those of ``sources`` without current bytecode."""
    return [source for source in sources if not is_current(source)]


def loaded_sources() -> list[Path]:
    """The source file of every module this process has imported from one."""
    files = {getattr(module, "__file__", None) for module in list(sys.modules.values())}
    return sorted(Path(f) for f in files if isinstance(f, str) and f.endswith(".py"))
