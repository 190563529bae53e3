"""Cgroups left by a killed daemon are removed by the next one, even those that cannot
go yet when it starts (their last processes still exiting): on the real kernel."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from toold_daemon.isolation import cgroup
from toold_daemon.isolation.cgroup import Cgroups


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_dead_daemons_cgroup_that_cannot_go_at_start_is_removed_later(monkeypatch: pytest.MonkeyPatch) -> None:
    first = Cgroups.detect()
    if not first.hierarchies:
        pytest.skip(f"no cgroups here: {first.reason}")
    parent = os.path.dirname(first.base)
    first.remove_bases()
    stale = os.path.join(parent, f"toold-{_dead_pid()}")
    busy = os.path.join(stale, "call-busy")
    os.makedirs(busy)
    # Its last process is still exiting when the next daemon starts: the kill has not
    # taken effect yet (here: it never comes, until the test ends the process itself).
    monkeypatch.setattr(cgroup, "kill_listed", lambda path, spare=0: True)
    monkeypatch.setattr(cgroup, "_write", lambda path, text: False)  # nor cgroup.kill
    exiting = _inside(busy)
    try:
        cgroups = Cgroups.detect()
        assert stale in cgroups.stale  # not removed at start, not forgotten either
        assert not cgroups.remove_stale_again() and os.path.isdir(stale)
        _end(exiting)  # what kept it is gone
        assert cgroups.remove_stale_again() and cgroups.stale == []
        assert not os.path.exists(stale)
        cgroups.remove_bases()
    finally:
        _end(exiting)
        for path in (busy, stale):
            if os.path.isdir(path):
                os.rmdir(path)


def test_a_cgroup_made_inside_a_dead_daemons_call_cgroup_goes_with_it() -> None:
    """A command able to write there (root without Landlock) can make cgroups inside its
    call's and move into them: the next daemon kills what runs there and removes them,
    deepest first, at its start."""
    first = Cgroups.detect()
    if not first.hierarchies:
        pytest.skip(f"no cgroups here: {first.reason}")
    parents = [os.path.dirname(h.base) for h in first.hierarchies]
    first.remove_bases()
    dead = _dead_pid()
    nested = [os.path.join(parent, f"toold-{dead}", "call-x", "inner", "deeper") for parent in parents]
    for path in nested:
        os.makedirs(path)
    hidden = _inside(*nested)  # listed in no cgroup.procs of the call cgroup itself
    try:
        cgroups = Cgroups.detect()
        assert cgroups.stale == []
        assert not any(os.path.exists(os.path.join(parent, f"toold-{dead}")) for parent in parents)
        assert hidden.wait(timeout=5) == -signal.SIGKILL
        cgroups.remove_bases()
    finally:
        _end(hidden)
        for path in nested:
            for level in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
                if os.path.isdir(level):
                    os.rmdir(level)


def _inside(*groups: str) -> subprocess.Popen[bytes]:
    """A process that lives in ``groups`` (one per hierarchy) until it is ended."""
    process = subprocess.Popen(["sleep", "60"])
    for group in groups:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(process.pid))
    return process


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
