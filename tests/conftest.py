"""Shared fixtures: temp sandbox roots, a real daemon process on a temp socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
from hypothesis import HealthCheck, settings

from tests.webserver import Server, serving

if TYPE_CHECKING:
    from toold_daemon.isolation.cgroup import Cgroups

settings.register_profile(
    "toold", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
#: A hunt for rare cases, not for CI: TOOLD_HYPOTHESIS=deep .venv/bin/pytest tests/daemon
settings.register_profile("deep", parent=settings.get_profile("toold"), max_examples=3000)
settings.load_profile(os.environ.get("TOOLD_HYPOTHESIS", "toold"))

BIN = Path(sys.executable).parent


@dataclass
class DaemonProcess:
    endpoint: str
    root: Path
    socket: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def client(self, **kwargs: object):  # type: ignore[no-untyped-def]
        from toold_client import Client

        return Client(self.endpoint, **kwargs)  # type: ignore[arg-type]


def start_daemon(
    tmp: Path,
    root: Path,
    *extra: str,
    config: str | None = None,
    socket_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> DaemonProcess:
    sock = (socket_dir or tmp / "run") / "toold.sock"
    endpoint = f"ipc://{sock}"
    args = [
        str(BIN / "toold"),
        "serve",
        "--root",
        str(root),
        "--endpoint",
        endpoint,
        "--state-dir",
        str(tmp / "state"),
        "--log-level",
        "WARNING",
        *extra,
    ]
    if config is not None:
        cfg = tmp / "toold.toml"
        cfg.write_text(config)
        args += ["--config", str(cfg)]
    (tmp / "state").mkdir(exist_ok=True)
    log = tmp / "daemon.log"
    environ = {k: v for k, v in os.environ.items() if k != "TOOLD_ENDPOINT"} | (env or {})
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=environ)
    daemon = DaemonProcess(endpoint, root, sock, proc, log)
    try:
        wait_ready(daemon)
    except BaseException:
        kill_process_tree(proc.pid)  # a daemon that never became ready is not left running
        proc.wait(timeout=10)
        raise
    return daemon


def kill_process_tree(pid: int, *, freeze_first: bool = False) -> None:
    """SIGKILL ``pid`` and everything it started; with ``freeze_first``, all of them are
    stopped first, so that none acts after another is gone (a power cut, for the files)."""
    try:
        top = psutil.Process(pid)
        processes = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for act in ("suspend", "kill") if freeze_first else ("kill",):
        for process in processes:
            try:
                getattr(process, act)()
            except psutil.NoSuchProcess:
                pass


@contextmanager
def module_daemon(
    factory: pytest.TempPathFactory, name: str, config: str, env: dict[str, str] | None = None
) -> Iterator[DaemonProcess]:
    """One daemon shared by a test module: its own temp dir and empty root, stopped after."""
    tmp = factory.mktemp(name)
    root = tmp / "root"
    root.mkdir()
    d = start_daemon(tmp, root, config=config, env=env)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def site() -> Iterator[Server]:
    """A real HTTP server on 127.0.0.1 shared by a test module (``tests.webserver``)."""
    with serving("127.0.0.1") as server:
        yield server


def open_socket_to_everyone(daemon: DaemonProcess) -> None:
    os.chmod(daemon.socket.parent, 0o711)
    os.chmod(daemon.socket, 0o666)


@contextmanager
def reachable_daemon(
    tmp: Path, *, config: str = "", root: Path | None = None, open_socket: bool = True
) -> Iterator[DaemonProcess]:
    """A daemon another uid can reach: its socket (and, unless ``root`` is given, its root)
    lie in a fresh 0711 directory, outside pytest's 0700 temp dirs; removed afterwards."""
    shared = Path(tempfile.mkdtemp(prefix="toold-shared-"))
    os.chmod(shared, 0o711)
    if root is None:
        root = shared / "workspace"
        root.mkdir(mode=0o755)
    d = start_daemon(tmp, root, socket_dir=shared / "run", config=config)
    try:
        if open_socket:
            open_socket_to_everyone(d)
        yield d
    finally:
        d.stop()
        shutil.rmtree(shared, ignore_errors=True)


@contextmanager
def daemon_rooted_in(shared: Path, tmp: Path, config: str) -> Iterator[DaemonProcess]:
    """A reachable daemon whose root is ``shared``/daemon-root, so that workspaces beside
    it in ``shared`` (the ``shared`` fixture) are other users' to open."""
    root = shared / "daemon-root"
    root.mkdir(mode=0o755)
    with reachable_daemon(tmp, root=root, config=config) as d:
        yield d


@contextmanager
def small_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A real tmpfs mounted at ``path`` (made here) with ``options`` ("size=200k"), for a
    disk that fills up; unmounted after. Skips the test where it cannot be mounted (root
    is needed)."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def wait_ready(daemon: DaemonProcess, timeout: float = 10.0) -> None:
    from toold_client import Client, DaemonUnavailable

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {daemon.proc.returncode}: {daemon.log.read_text()}")
        if daemon.socket.exists():
            try:
                with Client(daemon.endpoint, timeout=1.0) as c:
                    c.ping(timeout=1.0)
                return
            except DaemonUnavailable:
                pass
        time.sleep(0.01)
    raise RuntimeError("daemon did not become ready")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A fresh directory every user can enter (0755), outside pytest's 0700 temp dirs: for
    workspaces that another uid's sessions open; removed afterwards."""
    place = Path(tempfile.mkdtemp(prefix="toold-shared-ws-"))
    os.chmod(place, 0o755)
    try:
        yield place
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def daemon(tmp_path: Path, root: Path) -> Iterator[DaemonProcess]:
    d = start_daemon(tmp_path, root)
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.stop()


@pytest.fixture
def spawner() -> Iterator[tuple[int, socket.socket]]:
    """A real spawner, started as the daemon starts it: before the event loop runs (a
    fork from inside trio's loop would carry the loop's signal wake-up into it)."""
    from toold_daemon.isolation.spawner import start
    from toold_daemon.tools.builtin import builtin_tools

    spawner_pid, control = start(builtin_tools())
    try:
        yield spawner_pid, control
    finally:
        control.close()


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    """This machine's cgroup hierarchies, as a daemon in this process finds them (root
    only): whatever a test made below them is killed and removed after it."""
    from toold_daemon.isolation import cgroup

    found = cgroup.Cgroups.detect()
    if not found.hierarchies:
        pytest.skip(f"no per-call cgroups here: {found.reason}")
    try:
        yield found
    finally:  # even after a failure: nothing left running, nothing left behind
        for base in [h.base for h in found.hierarchies if os.path.isdir(h.base)]:
            cgroup.kill_listed(base)  # and in every cgroup inside it
            deadline = time.monotonic() + 5
            while not cgroup._rmdir(base) and time.monotonic() < deadline:  # deepest first
                time.sleep(0.01)
