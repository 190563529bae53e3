"""A finished batch the daemon no longer keeps is freed at once, by reference counting.

A batch caught in a reference cycle lives on until the garbage collector finds it; under
a stream of reads that made tens of thousands of objects for each of its passes, which
stopped every client for up to 100 ms at a time. A daemon served in this process, the
collector off while it serves: then, among what the collector would free, no batch."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
import trio

from toold_client import Client
from toold_daemon.config import Config
from toold_daemon.execution.batches import Batch
from toold_daemon.server import ServeOptions, serve
from toold_daemon.service.running import BatchRuns

pytestmark = pytest.mark.trio

KEPT = 5


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def unreachable_batches() -> list[Batch]:
    """The batches among what only the garbage collector would free (reference cycles)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [thing for thing in gc.garbage if isinstance(thing, Batch)]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)


async def test_batches_no_longer_kept_are_freed_without_the_garbage_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    remember = BatchRuns.remember

    def remembered(self: BatchRuns, batch: Batch) -> None:
        made.append(batch.batch_id)
        remember(self, batch)

    monkeypatch.setattr(BatchRuns, "remember", remembered)
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    base = Config()
    config = msgspec.structs.replace(base, daemon=msgspec.structs.replace(base.daemon, finished_batches_kept=KEPT))
    (tmp_path / "state").mkdir(mode=0o700)
    endpoint = f"ipc://{tmp_path}/d.sock"
    options = ServeOptions(roots=[root], endpoint=endpoint, state_dir=tmp_path / "state")

    def calls() -> list[bool]:
        with Client(endpoint, timeout=30) as client:
            oks = [client.call("read_file", {"path": "a.txt"}).ok for _ in range(30)]
            oks.append(not client.call("read_file", {"path": "missing.txt"}).ok)  # a failed call too
            oks += [client.call("list_directory", {"path": "."}).ok for _ in range(5)]
        return oks

    with collector_off():
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            nursery.start_soon(lambda: serve(config, options, ready=lambda _endpoint: ready.set()))
            await ready.wait()
            assert all(await trio.to_thread.run_sync(calls))
            await trio.sleep(0.2)  # what the loop still had queued (audit records) is written
            cyclic = unreachable_batches()  # while the daemon runs: the batches it keeps are reachable
            nursery.cancel_scope.cancel()
    assert len(made) == 36
    assert cyclic == [], f"{len(cyclic)} of the {len(made) - KEPT} batches no longer kept were left to the collector"
