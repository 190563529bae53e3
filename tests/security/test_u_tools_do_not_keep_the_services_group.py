"""Class U: tool processes do not keep the service's own group.

The socket's group is how users reach the daemon (the packaged ``toold`` group). A
client's commands used to keep it among their supplementary groups, and with it access
to whatever that group may read or write. The daemon's socket is made here in a setgid
directory of a fresh group, which the client user is a member of. Root only.
"""

from __future__ import annotations

import functools
import grp
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, open_socket_to_everyone, start_daemon
from tests.e2e.test_identity import OTHER_UID
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("groupadd") is None, reason="needs root and groupadd")


@pytest.fixture
def service_group() -> Iterator[int]:
    name = f"toold-g{os.getpid()}"
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    try:
        user = __import__("pwd").getpwuid(OTHER_UID).pw_name
        subprocess.run(["usermod", "-aG", name, user], check=True, capture_output=True)
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True, check=False)


@pytest.fixture
def daemon_in_group(tmp_path: Path, service_group: int) -> Iterator[DaemonProcess]:
    shared = Path(tempfile.mkdtemp(prefix="toold-group-"))
    os.chmod(shared, 0o711)
    root = shared / "workspace"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    run = shared / "run"
    run.mkdir()
    os.chown(run, 0, service_group)
    os.chmod(run, 0o2711)  # setgid: the socket made inside gets the service's group
    d = start_daemon(tmp_path, root, socket_dir=run, config='[tools.approval]\nallowlist = ["shell"]\n')
    try:
        open_socket_to_everyone(d)
        yield d
    finally:
        d.stop()
        shutil.rmtree(shared, ignore_errors=True)


def _groups_of_a_command(endpoint: str) -> None:
    from toold_client import Client

    with Client(endpoint, timeout=30) as c:
        result = c.call("shell", {"command": "id -G"})
    print(json.dumps([result.ok, result.content]))


def test_a_command_does_not_keep_the_sockets_group(daemon_in_group: DaemonProcess, service_group: int) -> None:
    assert daemon_in_group.socket.stat().st_gid == service_group
    assert service_group in os.getgrouplist(__import__("pwd").getpwuid(OTHER_UID).pw_name, 0)
    client = OtherUser(functools.partial(_groups_of_a_command, daemon_in_group.endpoint))
    try:
        ok, content = json.loads(client.line())
    finally:
        client.kill()
    assert ok, content
    groups = {int(g) for g in content.split("[")[0].split()}
    assert service_group not in groups
    assert groups  # the client's own groups are still there
