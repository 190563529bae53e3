"""A daemon started as root with ``[daemon] user``: the protocol process gives up root
for good; every tool still runs as its client, in a worker or a command of that uid.
Root only; the service user is created here if it is missing."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import DaemonProcess, open_socket_to_everyone, reachable_daemon, start_daemon
from tests.e2e.test_identity import OTHER_GID, OTHER_UID, as_other_user
from toold_client import Client

SERVICE_USER = "toold-svc-test"
CONFIG = f"""
[daemon]
user = "{SERVICE_USER}"
allow_root_clients = true

[tools.approval]
allowlist = ["shell", "run_code"]
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root")


def service_user() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "-M",
                "-d",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def cgroup_v2_kill() -> bool:
    """Whether this machine gives the daemon a cgroup v2 hierarchy of its own."""
    from toold_daemon.isolation.cgroup import Cgroups

    found = Cgroups.detect()
    try:
        return any(h.version == 2 for h in found.hierarchies)
    finally:
        found.remove_bases()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    service_user()
    if not cgroup_v2_kill():
        pytest.skip("an unprivileged daemon needs cgroup v2 (cgroup.kill) to stop other users' commands")
    with reachable_daemon(tmp_path, config=CONFIG, open_socket=False) as d:
        yield d


def protocol_process(daemon: DaemonProcess) -> psutil.Process:
    return psutil.Process(daemon.proc.pid)


def test_the_protocol_process_is_the_service_user_for_good(daemon: DaemonProcess) -> None:
    uid, gid = service_user()
    with daemon.client(timeout=30) as client:
        client.ping()
    process = protocol_process(daemon)
    assert tuple(process.uids()) == (uid, uid, uid)  # real, effective, saved
    assert tuple(process.gids()) == (gid, gid, gid)
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["CapPrm"].strip() == "0000000000000000"
    assert fields["CapBnd"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Groups"].strip() == ""
    # the spawner keeps root: it is the only process that may start children as others
    [spawner] = [c for c in process.children() if c.uids().effective == 0]
    assert spawner.pid > 0


def test_every_thread_of_the_protocol_process_gave_up_root(daemon: DaemonProcess) -> None:
    """no_new_privs, the bounding set and Landlock belong to a thread, not a process: a
    thread started before the drop (libzmq's I/O threads, a thread pool) would keep the
    daemon's root-era state, and a bug in it could exec its way back to privileges."""
    with daemon.client(timeout=30) as client:
        client.call("read_file", {"path": "."})  # the journal writer and any lazy threads exist now
    tasks = sorted(Path(f"/proc/{daemon.proc.pid}/task").iterdir())
    assert len(tasks) >= 3  # the loop, libzmq's I/O thread, the journal writer
    for task in tasks:
        status = (task / "status").read_text()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        name = fields["Name"].strip()
        assert fields["NoNewPrivs"].strip() == "1", name
        assert fields["CapBnd"].strip() == "0000000000000000", name
        assert fields["CapEff"].strip() == fields["CapPrm"].strip() == "0000000000000000", name
        assert fields["Uid"].split() == [fields["Uid"].split()[0]] * 4 != ["0"] * 4, name


def test_tools_still_run_as_each_client(daemon: DaemonProcess) -> None:
    """A root client reads its own 0600 file (so the read ran in a worker as root, not in
    the daemon, which could not); the throwaway user cannot; commands report the
    client's uid; a command that outlives its timeout is still killed."""
    secret = daemon.root / "secret.txt"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    open_socket_to_everyone(daemon)
    with daemon.client(timeout=30) as client:
        read = client.call("read_file", {"path": "secret.txt"})
        assert read.ok and "root only" in read.content, read
        shell = client.call("shell", {"command": "id -u"})
        assert shell.ok and shell.content.split()[0] == "0", shell.content
        written = client.call("write_file", {"path": "by-root.txt", "content": "x\n"})
        assert written.ok, written.content
    assert (daemon.root / "by-root.txt").stat().st_uid == 0

    def act(client: Client) -> dict[str, Any]:
        denied = client.call("read_file", {"path": "secret.txt"})
        ran = client.call("shell", {"command": "id -u; id -g"})
        started = time.monotonic()
        slow = client.call("shell", {"command": "sleep 30", "timeout_ms": 1000})
        return {
            "denied": [denied.ok, denied.error.type if denied.error else None],
            "ran": ran.content,
            "slow": [slow.ok, slow.error.type if slow.error else None, time.monotonic() - started],
        }

    report = as_other_user(daemon.endpoint, act)
    assert report.get("exception") is None, report
    assert report["denied"] == [False, "PermissionDenied"]
    assert report["ran"].split()[:2] == [str(OTHER_UID), str(OTHER_GID)]
    ok, kind, took = report["slow"]
    assert not ok and kind == "Timeout" and took < 15
    time.sleep(0.5)
    sleepers = [p for p in psutil.process_iter(["cmdline", "uids"]) if p.info["cmdline"] == ["sleep", "30"]]
    assert not [p for p in sleepers if p.info["uids"].real == OTHER_UID], "the timed-out command lives on"


def test_the_dropped_daemon_stops_cleanly(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=30) as client:
        assert client.call("list_directory", {"path": "."}).ok
    assert daemon.stop(signal.SIGTERM) == 0
    assert not daemon.socket.exists()


def test_a_root_start_takes_back_the_runtime_directory_it_gave_away(tmp_path: Path) -> None:
    """The first start handed the socket's directory and lock to the service user; the
    next root start on the same directory (no socket activation) serves again rather
    than refusing a directory that is "not ours"."""
    uid, _gid = service_user()
    if not cgroup_v2_kill():
        pytest.skip("an unprivileged daemon needs cgroup v2 (cgroup.kill)")
    shared = Path(tempfile.mkdtemp(prefix="toold-restart-"))
    os.chmod(shared, 0o711)  # the service user binds the socket below it
    try:
        for attempt in range(2):
            state = tmp_path / f"try{attempt}"
            state.mkdir()
            (state / "root").mkdir()
            daemon = start_daemon(state, state / "root", config=CONFIG, socket_dir=shared / "run")
            try:
                assert (shared / "run").stat().st_uid == uid
                with daemon.client(timeout=30) as client:
                    assert client.call("list_directory", {"path": "."}).ok
            finally:
                daemon.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_an_unprivileged_daemon_opens_workspaces_in_private_homes(tmp_path: Path) -> None:
    """The daemon's own user cannot look into a 0700 home; the client's worker can, and
    the spawner (root) resolves the path before it lets a worker start there. A symlink in
    the home that leads out of it is still refused."""
    from tests.e2e.test_identity import as_user
    from tests.e2e.test_workspaces import _user_with_home

    service_user()
    if not cgroup_v2_kill():
        pytest.skip("an unprivileged daemon needs cgroup v2")
    uid, gid, home = _user_with_home("p")
    (home / "projects" / "escape").symlink_to("/etc")
    config = CONFIG + '\n[tools.sandbox]\nallowed_roots = ["~/projects"]\n'
    with reachable_daemon(tmp_path, config=config) as d:

        def act(client: Client) -> dict[str, Any]:
            client.workspace = str(home / "projects" / "app")
            roots = client.hello().roots
            read = client.call("read_file", {"path": "mine.txt"})
            with Client(client.endpoint, timeout=10, workspace=home / "projects" / "escape") as other:
                try:
                    other.hello()
                    escaped = "accepted"
                except Exception as exc:  # RemoteError
                    escaped = str(exc)
            return {"roots": roots, "read": read.content, "escaped": escaped}

        report = as_user(d.endpoint, uid, gid, act)
    assert report.get("exception") is None, report
    assert report["roots"] == [str(home / "projects" / "app")]
    assert "p's file" in report["read"]
    assert report["escaped"].startswith("WORKSPACE_REFUSED"), report["escaped"]


def test_a_uid_the_config_does_not_admit_gets_no_tool_run(tmp_path: Path) -> None:
    """The socket lets everyone connect, but ``allowed_uids`` names only root: the spawner
    refuses every child for the throwaway user, whatever the protocol process asks."""
    config = '[daemon]\nallowed_uids = [0]\n\n[tools.approval]\nallowlist = ["shell"]\n'
    with reachable_daemon(tmp_path, config=config) as d:
        (d.root / "open.txt").write_text("world-readable\n")

        def act(client: Client) -> dict[str, Any]:
            read = client.call("read_file", {"path": "open.txt"})
            shell = client.call("shell", {"command": "echo ran"})
            return {
                "read": [read.ok, read.error.message if read.error else ""],
                "shell": [shell.ok, shell.content],
            }

        report = as_other_user(d.endpoint, act)
        with d.client(timeout=20) as client:  # root is admitted
            assert client.call("read_file", {"path": "open.txt"}).ok
    assert report.get("exception") is None, report
    ok, message = report["read"]
    assert not ok and f"uid {OTHER_UID} may not use this daemon" in message
    ok, content = report["shell"]
    assert not ok and "ran" not in content.replace("echo ran", "")
