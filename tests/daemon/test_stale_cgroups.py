"""Cgroups left by a killed daemon are removed by the next one, even those that cannot
go yet when it starts (their last processes still exiting): on the real kernel."""

from __future__ import annotations

import os
import subprocess

import pytest

from toold_daemon.isolation.cgroup import Cgroups


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_dead_daemons_cgroup_that_cannot_go_at_start_is_removed_later() -> None:
    first = Cgroups.detect()
    if not first.hierarchies:
        pytest.skip(f"no cgroups here: {first.reason}")
    parent = os.path.dirname(first.base)
    first.remove_bases()
    stale = os.path.join(parent, f"toold-{_dead_pid()}")
    busy = os.path.join(stale, "not-ours")  # rmdir of the stale base fails while this exists
    os.makedirs(busy)
    try:
        cgroups = Cgroups.detect()
        assert stale in cgroups.stale  # not removed at start, not forgotten either
        assert not cgroups.remove_stale_again() and os.path.isdir(stale)
        os.rmdir(busy)  # what kept it (for a killed daemon: processes still exiting) is gone
        assert cgroups.remove_stale_again() and cgroups.stale == []
        assert not os.path.exists(stale)
        cgroups.remove_bases()
    finally:
        for path in (busy, stale):
            if os.path.isdir(path):
                os.rmdir(path)
