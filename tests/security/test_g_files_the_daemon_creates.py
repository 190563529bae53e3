"""Class G: files the daemon creates are private, and its runtime directory and lock
file cannot be planted by someone else."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, start_daemon


def serve(tmp_path: Path, root: Path, sock: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "state").mkdir(exist_ok=True)
    return subprocess.run(
        [str(BIN / "toold"), "serve", "--root", str(root), "--endpoint", f"ipc://{sock}",
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_state_files_and_runtime_dir_are_private(tmp_path: Path, root: Path) -> None:
    """Attack: read another user's journal (every call's arguments and results) or its
    WAL, or the lock and socket, because they were created with a permissive umask."""
    old = os.umask(0o022)
    try:
        d = start_daemon(tmp_path, root)
    finally:
        os.umask(old)
    try:
        with d.client(timeout=30) as c:
            c.call("read_file", {"path": "missing.txt"})
        made = [p for p in (tmp_path / "state").rglob("*")] + [d.socket.parent, Path(str(d.socket) + ".lock")]
        assert any(p.name.startswith("journal") for p in made)
        for path in made:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode & 0o077 == 0, f"{path} is {mode:o}"
    finally:
        d.stop()


def test_a_runtime_dir_of_another_owner_or_a_symlink_stops_the_daemon(tmp_path: Path, root: Path) -> None:
    """Attack: pre-create the socket directory (or make it a symlink to a place the
    attacker controls) before the daemon starts, to take over its socket."""
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    link = tmp_path / "run-link"
    link.symlink_to(elsewhere)
    done = serve(tmp_path, root, link / "toold.sock")
    assert done.returncode == 2 and "symlink" in done.stderr
    assert not list(elsewhere.iterdir())

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = serve(tmp_path, root, shared / "toold.sock")
    assert done.returncode == 2 and "mode 777" in done.stderr

    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        done = serve(tmp_path, root, foreign / "toold.sock")
        assert done.returncode == 2 and "belongs to uid 65534" in done.stderr


def test_a_lock_file_planted_as_a_symlink_is_not_written_through(tmp_path: Path, root: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run / "toold.sock.lock").symlink_to(victim)
    done = serve(tmp_path, root, run / "toold.sock")
    assert done.returncode == 2 and "symlink" in done.stderr
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_temp_dirs_are_gone_after_stop_or_at_the_next_start(tmp_path: Path, root: Path, how: str) -> None:
    """A daemon killed with SIGKILL cannot clean up: the next one removes what it left."""
    import signal

    import psutil

    config = '[tools.approval]\nallowlist = ["shell"]\n'
    d = start_daemon(tmp_path, root, config=config)
    with d.client(timeout=30) as c:
        temp = c.call("shell", {"command": "echo $TMPDIR"}).content.splitlines()[0]
    base = Path(temp).parents[1]
    assert base.is_dir() and base.name.startswith(f"toold-{os.geteuid()}-p{d.proc.pid}-")
    children = psutil.Process(d.proc.pid).children(recursive=True)
    d.stop(getattr(signal, how))
    for child in children:  # the spawner and zygotes die with the daemon
        try:
            child.wait(timeout=10)
        except psutil.NoSuchProcess:
            pass
    if how == "SIGKILL":  # (another daemon starting meanwhile may already have removed it)
        d2 = start_daemon(tmp_path, root, config=config)
        d2.stop()
        time.sleep(0.1)
    assert not base.exists()
