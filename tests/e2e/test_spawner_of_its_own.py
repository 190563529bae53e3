"""The system package's shape: the spawner runs on its own as root (``toold spawner``,
toold-spawner.service) and the protocol process is started as the service user, never
root, without a capability (``toold serve --spawner-socket``, toold.service). Here both
run as plain processes the way systemd would start them: the protocol process in a
cgroup delegated to the service user (``Delegate=yes``), its bounding set empty, in
network and IPC namespaces of its own (``PrivateNetwork=yes``, ``PrivateIPC=yes``).

Root only; the service user is created if it is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import BIN, DaemonProcess, open_socket_to_everyone, wait_ready
from tests.e2e.test_identity import OTHER_UID, as_other_user
from tests.e2e.test_privilege_separation import CONFIG, service_user
from toold_client import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root")


def delegated_parent() -> Path | None:
    """The cgroup v2 directory the test's cgroups go under (None: no writable v2 here)."""
    from toold_daemon.isolation.cgroup import Cgroups

    found = Cgroups.detect()
    try:
        unified = [h for h in found.hierarchies if h.version == 2]
        return Path(unified[0].base).parent if unified else None
    finally:
        found.remove_bases()


@dataclass
class Split:
    shared: Path
    workspace: Path
    config: Path
    spawner_socket: Path
    cgroup: Path
    spawner: subprocess.Popen[bytes]
    tmp: Path

    def serve(self) -> DaemonProcess:
        """Start a protocol process as the service user, as toold.service would."""
        uid, gid = service_user()
        sock = self.shared / "run" / "toold.sock"
        log = self.tmp / f"serve-{time.monotonic_ns()}.log"
        command = [
            str(BIN / "toold"),
            "serve",
            "--config",
            str(self.config),
            "--spawner-socket",
            str(self.spawner_socket),
            "--endpoint",
            f"ipc://{sock}",
            "--root",
            str(self.workspace),
            "--state-dir",
            str(self.shared / "state"),
            "--log-level",
            "INFO",
        ]
        become = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--bounding-set=-all"]
        script = f'echo $$ > {self.cgroup}/cgroup.procs && exec "$@"'
        private = ["unshare", "--net", "--ipc"]  # PrivateNetwork=yes, PrivateIPC=yes
        proc = subprocess.Popen(
            [*private, "sh", "-c", script, "sh", *become, *command], stdout=subprocess.DEVNULL, stderr=log.open("wb")
        )
        daemon = DaemonProcess(f"ipc://{sock}", self.workspace, sock, proc, log)
        wait_ready(daemon, timeout=20)
        open_socket_to_everyone(daemon)
        return daemon


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    uid, gid = service_user()
    parent = delegated_parent()
    if parent is None:
        pytest.skip("an unprivileged protocol process needs a delegated cgroup v2 subtree")
    shared = Path(tempfile.mkdtemp(prefix="toold-split-"))
    os.chmod(shared, 0o711)
    workspace = shared / "workspace"
    workspace.mkdir(mode=0o755)
    for private in ("state", "run"):
        (shared / private).mkdir(mode=0o700)
        os.chown(shared / private, uid, gid)
    config = shared / "toold.toml"
    config.write_text(CONFIG)
    config.chmod(0o644)
    cgroup = parent / f"toold-split-{os.getpid()}"  # what systemd's Delegate=yes hands the unit
    cgroup.mkdir()
    for path in (cgroup, *(cgroup / name for name in ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads"))):
        os.chown(path, uid, gid)
    spawner_socket = shared / "spawner" / "spawner.sock"
    spawner = subprocess.Popen(
        [
            str(BIN / "toold"),
            "spawner",
            "--config",
            str(config),
            "--spawner-socket",
            str(spawner_socket),
            "--endpoint",
            f"ipc://{shared / 'run' / 'toold.sock'}",
            "--root",
            str(workspace),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "spawner.log").open("wb"),
    )
    deadline = time.monotonic() + 10
    while not spawner_socket.exists() and time.monotonic() < deadline:
        assert spawner.poll() is None, (tmp_path / "spawner.log").read_text()
        time.sleep(0.02)
    split = Split(shared, workspace, config, spawner_socket, cgroup, spawner, tmp_path)
    try:
        yield split
    finally:
        spawner.terminate()
        spawner.wait(10)
        (cgroup / "cgroup.kill").write_text("1")
        for child in sorted(cgroup.rglob("*/"), key=lambda p: -len(p.parts)):
            if child.is_dir() and child != cgroup:
                _rmdir_soon(child)
        _rmdir_soon(cgroup)
        shutil.rmtree(shared, ignore_errors=True)


def _rmdir_soon(path: Path) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def call_quietly(daemon: DaemonProcess, command: str) -> None:
    """A shell call whose daemon is about to die under it."""
    try:
        with daemon.client(timeout=30) as client:
            client.call("shell", {"command": command})
    except Exception:  # the daemon is killed mid-call on purpose
        pass


def status_of(pid: int) -> dict[str, str]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)}


def test_the_protocol_process_is_never_root_and_tools_run_as_their_clients(split: Split) -> None:
    uid, gid = service_user()
    daemon = split.serve()
    try:
        fields = status_of(daemon.proc.pid)
        assert fields["Uid"].split() == [str(uid)] * 4 and fields["Gid"].split() == [str(gid)] * 4
        assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
        assert fields["NoNewPrivs"] == "1"
        assert not [c for c in psutil.Process(daemon.proc.pid).children()], "the protocol process forked"
        secret = split.workspace / "secret.txt"
        secret.write_text("root only\n")
        secret.chmod(0o600)
        with daemon.client(timeout=30) as client:
            read = client.call("read_file", {"path": "secret.txt"})
            assert read.ok and "root only" in read.content, read  # a worker of root's read it
            shell = client.call("shell", {"command": "id -u; cat /proc/self/cgroup"})
            assert shell.ok and shell.content.split()[0] == "0", shell.content
            assert f"/{split.cgroup.name}/toold-{daemon.proc.pid}/call-" in shell.content

        def act(client: Client) -> dict[str, Any]:
            denied = client.call("read_file", {"path": "secret.txt"})
            ran = client.call("shell", {"command": "id -u"})
            return {"denied": [denied.ok, denied.content], "uid": ran.content.split()[0] if ran.ok else ran.content}

        report = as_other_user(daemon.endpoint, act)
        assert report.get("uid") == str(OTHER_UID), report
        assert report["denied"][0] is False and "root only" not in report["denied"][1]
    finally:
        daemon.stop()


def test_a_restarted_protocol_process_finds_the_spawner_and_stops_what_the_last_one_left(split: Split) -> None:
    """systemd restarts a protocol process that died: the spawner (another unit) keeps
    running and serves the new one; the commands the dead one started are killed."""
    first = split.serve()
    pid_file = split.workspace / "sleeper.pid"
    caller = threading.Thread(target=call_quietly, args=(first, "echo $$ > sleeper.pid; exec sleep 300"), daemon=True)
    try:
        caller.start()
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        orphan = int(pid_file.read_text())
        assert psutil.pid_exists(orphan)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    second = split.serve()
    try:
        with second.client(timeout=30) as client:
            ran = client.call("shell", {"command": "id -u"})
            assert ran.ok and ran.content.split()[0] == "0", ran.content
        assert split.spawner.poll() is None
        deadline = time.monotonic() + 5
        while psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the first protocol process's command outlived it"
            time.sleep(0.05)
    finally:
        second.stop()


def test_doctor_reports_where_the_spawner_runs(split: Split) -> None:
    from tests.e2e.test_doctor import doctor

    _code, report = doctor("--config", str(split.config), "--spawner-socket", str(split.spawner_socket))
    spawner = report["service"]["spawner"]  # type: ignore[index]
    assert spawner["on"] and f"of its own at {split.spawner_socket}" in spawner["detail"], spawner
    code, report = doctor("--config", str(split.config), "--spawner-socket", str(split.shared / "nothing.sock"))
    assert code == 1 and report["service"]["spawner"]["required"]  # type: ignore[index]


def test_a_command_reaches_neither_the_protocol_process_nor_the_spawner(split: Split) -> None:
    """The guards of the forked spawner hold for the spawner of its own, whose daemon is
    whoever connected: a root client's command cannot connect to the daemon's socket
    (it descends from the spawner), nor signal the protocol process or the spawner."""
    from tests.security.test_b_tools_cannot_reach_the_daemon import plant_client

    daemon = split.serve()
    try:
        toolctl = plant_client(split.workspace)
        with daemon.client(timeout=60) as client:
            out = client.call("shell", {"command": f"{toolctl} --endpoint {daemon.endpoint} ping --wait 2; echo rc=$?"})
            assert "rc=0" not in out.content and "rc=2" in out.content, out.content
            for pid in (daemon.proc.pid, split.spawner.pid):
                killed = client.call("shell", {"command": f"kill -9 {pid} 2>&1; echo rc=$?"})
                assert "rc=0" not in killed.content, (pid, killed.content)
        assert daemon.proc.poll() is None and split.spawner.poll() is None
        assert "refused a connection" in daemon.log.read_text()
    finally:
        daemon.stop()
