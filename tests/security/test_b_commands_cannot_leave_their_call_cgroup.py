"""A command held whole by its call's cgroup ends without the token sweep: killing and
emptying that cgroup ends the call. That holds only if nothing the command starts can
move itself into another cgroup.

Attack, as root (the strongest client: file permissions alone would let it write any
``cgroup.procs``) and as another user: every process the command starts tries to write
its own pid into each ``cgroup.procs`` it can find (the hierarchies' roots, the daemon's
base, other calls'), and if one write is taken it keeps running with the call's token.
Every write must be refused, and nothing may outlive the call.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.conftest import DaemonProcess, reachable_daemon
from tests.e2e.test_identity import as_other_user
from tests.e2e.test_isolation import alive_with
from toold_client import Client

CONFIG = '[tools.approval]\nallowlist = ["shell"]\n'


def escape_command(marker: str) -> str:
    """For each hierarchy the command is in (``/proc/self/cgroup``): the hierarchy's root
    and the daemon's base, each by its path and through ``/proc/self/root`` and
    ``/proc/1/root``; a process per target writes its own pid there and, if taken, stays."""
    return (
        "paths='/sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs'; "
        'while IFS=: read -r n ctrl path; do c=${ctrl#name=}; [ -z "$c" ] && c=unified; '
        'paths="$paths /sys/fs/cgroup/$c/cgroup.procs /sys/fs/cgroup/$c${path%/*}/cgroup.procs"; '
        "done < /proc/self/cgroup; tried=0; "
        'for f in $paths; do for route in "" /proc/self/root /proc/1/root; do tried=$((tried+1)); '
        f'sh -c \'echo $$ > "$1" 2>/dev/null && echo "MOVED $1" && exec sleep {marker}\' escapee "$route$f" & '
        'done; done; sleep 0.5; echo "tried $tried"'
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with reachable_daemon(tmp_path_factory.mktemp("cgroup-escape"), config=CONFIG) as d:
        yield d


def cgroups_on(client: Client) -> None:
    """Only with per-call cgroups and Landlock does the daemon rely on the cgroup alone."""
    layers = {layer.name: layer for layer in client.hello().isolation}
    for name in ("cgroup", "landlock"):
        if not layers[name].available:
            pytest.skip(f"no {name} here (the token sweep still runs): {layers[name].detail}")


def outcome_of(content: str, marker: str) -> None:
    assert int(content.rsplit("tried ", 1)[1].split(maxsplit=1)[0]) >= 12, content  # every target was tried
    assert "MOVED" not in content, content  # and no write into a cgroup.procs was taken
    deadline = time.monotonic() + 3
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive_with(marker) == []


def test_a_root_command_cannot_move_itself_out_of_its_call(daemon: DaemonProcess) -> None:
    marker = f"39{uuid.uuid4().int % 10**6:06d}"
    with daemon.client(timeout=30) as client:
        cgroups_on(client)
        result = client.call("shell", {"command": escape_command(marker)})
    assert result.ok, result.content
    outcome_of(result.content, marker)


def test_another_users_command_cannot_move_itself_out_of_its_call(daemon: DaemonProcess) -> None:
    marker = f"39{uuid.uuid4().int % 10**6:06d}"

    def act(client: Client) -> dict[str, Any]:
        cgroups_on(client)
        result = client.call("shell", {"command": escape_command(marker)})
        return {"ok": result.ok, "content": result.content}

    report = as_other_user(daemon.endpoint, act)
    assert report["ok"], report
    outcome_of(report["content"], marker)
