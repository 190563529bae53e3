"""A protocol process that dropped root owns the state directory; if it was compromised,
it could leave symbolic links there for the next start, made as root, to open, chmod or
write through. Each file the daemon touches at start is tried: the start refuses it, or
replaces it without following it, and the file the link points at is never changed."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_daemon
from tests.e2e.test_privilege_separation import CONFIG, cgroup_v2_kill, service_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root")

REFUSED = ["journal.lock", "journal.sqlite3", "journal.sqlite3-wal", "memory.sqlite3", "memory.sqlite3-shm", "undo"]
REPLACED = ["last-recovery.json", "last-recovery.json.tmp"]


@pytest.fixture
def dropped_state(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The state directory of a daemon that ran as the service user (and so is that user's)."""
    uid, _ = service_user()
    if not cgroup_v2_kill():
        pytest.skip("an unprivileged daemon needs cgroup v2")
    shared = Path(tempfile.mkdtemp(prefix="toold-shared-"))
    os.chmod(shared, 0o711)
    (shared / "workspace").mkdir(mode=0o755)
    start_daemon(tmp_path, shared / "workspace", socket_dir=shared / "run", config=CONFIG).stop()
    state = tmp_path / "state"
    assert state.stat().st_uid == uid  # what a compromised protocol process may write in
    yield state, shared
    shutil.rmtree(shared, ignore_errors=True)


def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim"  # stands for /etc/shadow: root's, 0640, precious
    target.write_text("root:secret\n")
    os.chmod(target, 0o640)
    return target


def plant(state: Path, name: str, target: Path) -> None:
    uid, gid = service_user()
    path = state / name
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)
    os.chown(path, uid, gid, follow_symlinks=False)


def untouched(target: Path) -> bool:
    st = target.stat()
    return target.read_text() == "root:secret\n" and stat.S_IMODE(st.st_mode) == 0o640 and st.st_uid == 0


@pytest.mark.parametrize("name", REFUSED)
def test_a_planted_link_stops_the_root_start_and_is_not_followed(
    dropped_state: tuple[Path, Path], tmp_path: Path, name: str
) -> None:
    state, shared = dropped_state
    target = victim(tmp_path)
    plant(state, name, target)
    with pytest.raises(RuntimeError, match="symbolic link"):
        start_daemon(tmp_path, shared / "workspace", socket_dir=shared / "run", config=CONFIG)
    assert untouched(target)


@pytest.mark.parametrize("name", REPLACED)
def test_a_note_written_at_start_replaces_a_planted_link(
    dropped_state: tuple[Path, Path], tmp_path: Path, name: str
) -> None:
    state, shared = dropped_state
    target = victim(tmp_path)
    plant(state, name, target)
    # a fresh socket directory: the first start gave its own to the service user
    start_daemon(tmp_path, shared / "workspace", socket_dir=shared / "run2", config=CONFIG).stop()
    assert untouched(target)
    note = state / "last-recovery.json"
    assert not note.is_symlink() and '"interrupted_calls": 0' in note.read_text()
