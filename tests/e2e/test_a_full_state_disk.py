"""The state directory's disk fills up (a real tmpfs of 600 KB under a real daemon):
writes that must be journaled are refused with the reason, reads go on, nothing is left
running, and once there is room again writes are journaled and run as before."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import start_daemon
from toold_client import Client, RemoteError

CONFIG = '[tools.approval]\nallowlist = ["write_file"]\n'


def write(client: Client, n: int) -> str:
    """ "ok", or why a 60 KB write was not done."""
    try:
        result = client.call(
            "write_file", {"path": f"big{n % 3}.txt", "content": "x" * 60_000 + str(n), "overwrite": True}
        )
    except RemoteError as exc:
        return f"refused: {exc}"
    return "ok" if result.ok else f"failed: {result.content}"


def test_a_full_state_disk_refuses_writes_with_the_reason_and_writes_resume_once_there_is_room(tmp_path: Path) -> None:
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    state = tmp_path / "state"
    state.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k,mode=700", "tmpfs", str(state)], check=False
    ).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    root = tmp_path / "root"
    root.mkdir()
    (root / "note.txt").write_text("still readable\n")
    d = None
    try:
        d = start_daemon(tmp_path, root, config=CONFIG)
        with Client(d.endpoint, timeout=30) as client:
            outcomes = []
            for n in range(40):
                outcomes.append(write(client, n))
                read = client.call("read_file", {"path": "note.txt"})
                assert read.ok and read.content == "still readable\n", read
                if outcomes[-1] != "ok" and len(outcomes) > 3:
                    break
            refusals = [o for o in outcomes if o != "ok"]
            assert refusals, outcomes  # the disk did fill up
            assert all("disk is full" in o or "No space left" in o for o in refusals), refusals
            subprocess.run(["mount", "-o", "remount,size=16m", str(state)], check=True)
            assert write(client, 100) == "ok" and write(client, 101) == "ok"
            assert (root / "big2.txt").read_text().endswith("101")
            # a batch whose end the journal could not record is listed as it ended, as
            # get_batch gives it, not as the journal's "running"
            listed = {batch.batch_id: batch.state for batch in client.list_batches(limit=50)}
            assert "running" not in listed.values(), listed
            assert all(client.get_batch(b).state == state for b, state in listed.items()), listed
        assert d.proc.poll() is None, "the daemon exited"
        assert d.stop() == 0
    finally:
        if d is not None:
            d.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)
