"""``python -m toold_daemon``: the same as the ``toold`` program.

Run this way, Python puts the directory it was started in first on the module path, and
every module imported afterwards (at start, by a tool's first use, in a child after it
entered the workspace) is looked for there before the installed ones: a workspace file
named ``httpx.py`` or ``json.py`` would run instead, in the spawner as root. Only the
installed places stay on the path. (This package itself was already found by then: start
it from a directory nobody else writes, or use the ``toold`` program.)
"""

import os
import sys

_started_in = os.getcwd()
sys.path[:] = [entry for entry in sys.path if entry not in ("", ".", _started_in)]

from .program import main  # noqa: E402 (after the path is settled)

raise SystemExit(main())
