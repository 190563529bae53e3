"""The ``toold`` program's entry point (``python -m toold_daemon`` too).

The garbage collector stays off while the daemon's modules load: the imports allocate
tens of thousands of objects that live as long as the process, and on the way they
trigger about 90 collections that find next to nothing (17 ms of a start of about
300 ms). ``cli.main`` turns it back on at once for every command but ``serve``;
``serve`` freezes what start-up built, forks the spawner, and turns it on once its
own set-up is frozen too (``server.settle_garbage_collector``), so that no collection
ever walks the start-up objects (CPython's advice for processes that fork).
"""

from __future__ import annotations

import gc


def main() -> int:
    gc.disable()
    from .cli import main as run

    return run()
