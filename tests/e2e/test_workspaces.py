"""Per-session workspaces, on a real daemon: a session names its directory in ``hello``;
it becomes the session's only root if it lies in a place the daemon allows for that
user and that user's own worker can open it. Other users are real accounts (root only)."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, daemon_rooted_in
from tests.e2e.test_identity import OTHER_UID, as_other_user, as_user
from toold_client import Client, RemoteError

CONFIG = """
[tools.approval]
allowlist = ["shell"]

[tools.sandbox]
allowed_roots = ["~/projects", "{shared}"]
"""


def _user_with_home(tag: str) -> tuple[int, int, Path]:
    """A throwaway system user whose home is a fresh directory it owns (0700)."""
    home = Path(tempfile.mkdtemp(prefix=f"toold-home-{tag}-"))
    name = f"toold-{tag}{os.getpid()}"[:31]
    made = subprocess.run(
        ["useradd", "--system", "-M", "-d", str(home), "--shell", "/usr/sbin/nologin", "--user-group", name],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot create a user: {made.stderr!r}")
    atexit.register(lambda: subprocess.run(["userdel", name], capture_output=True, check=False))
    atexit.register(lambda: shutil.rmtree(home, ignore_errors=True))
    entry = pwd.getpwnam(name)
    (home / "projects" / "app").mkdir(parents=True)
    (home / "projects" / "app" / "mine.txt").write_text(f"{tag}'s file\n")
    for path in (home, home / "projects", home / "projects" / "app", home / "projects" / "app" / "mine.txt"):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    return entry.pw_uid, entry.pw_gid, home


pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None, reason="needs root")


@pytest.fixture
def daemon(tmp_path: Path, shared: Path) -> Iterator[DaemonProcess]:
    with daemon_rooted_in(shared, tmp_path, CONFIG.format(shared=shared)) as d:
        yield d


def refusal(endpoint: str, workspace: str) -> str:
    with Client(endpoint, timeout=20, workspace=workspace) as client:
        try:
            client.hello()
        except RemoteError as exc:
            return f"{exc.code}: {exc}"
    return "accepted"


def test_a_workspace_becomes_the_sessions_only_root(daemon: DaemonProcess, shared: Path) -> None:
    project = shared / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "x.txt").write_text("in the workspace\n")
    (daemon.root / "x.txt").write_text("in the daemon root\n")
    with Client(daemon.endpoint, timeout=20, workspace=project) as client:
        assert client.hello().roots == [str(project)]
        read = client.call("read_file", {"path": "src/x.txt"})
        assert read.ok and "in the workspace" in read.content
        escape = client.call("read_file", {"path": "../daemon-root/x.txt"})
        assert not escape.ok and escape.error is not None and escape.error.type == "SandboxViolation"
        pwd_ = client.call("shell", {"command": "pwd"})
        assert pwd_.ok and pwd_.content.strip().splitlines()[0] == str(project), pwd_.content
        written = client.call("write_file", {"path": "new.txt", "content": "made here\n"})
        assert written.ok, written.content
    assert (project / "new.txt").read_text() == "made here\n"
    with Client(daemon.endpoint, timeout=20) as plain:  # no workspace: the daemon's roots, as before
        assert plain.hello().roots == [str(daemon.root)]
        assert "in the daemon root" in plain.call("read_file", {"path": "x.txt"}).content


def test_workspaces_outside_the_allowed_places_are_refused(daemon: DaemonProcess, tmp_path: Path, shared: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert refusal(daemon.endpoint, str(elsewhere)).startswith("WORKSPACE_REFUSED")
    assert refusal(daemon.endpoint, "/etc").startswith("WORKSPACE_REFUSED")
    assert refusal(daemon.endpoint, "relative/dir").startswith("WORKSPACE_REFUSED")
    assert refusal(daemon.endpoint, str(shared / "missing")).startswith("WORKSPACE_REFUSED")
    # a symlink inside an allowed place that leads out of it is judged by where it leads
    (shared / "to-etc").symlink_to("/etc")
    why = refusal(daemon.endpoint, str(shared / "to-etc"))
    assert why.startswith("WORKSPACE_REFUSED") and "resolved to /etc" in why, why
    # a refused session runs nothing, whatever it sends next
    with Client(daemon.endpoint, timeout=20, workspace=elsewhere) as client:
        with pytest.raises(RemoteError) as refused:
            client.call("list_directory", {"path": "."})
        assert refused.value.code == "WORKSPACE_REFUSED"


def test_a_workspace_that_user_cannot_open_is_refused(daemon: DaemonProcess, shared: Path) -> None:
    private = shared / "root-only"
    private.mkdir(mode=0o700)
    assert refusal(daemon.endpoint, str(private)) == "accepted"  # root may

    def attempt(client: Client) -> dict[str, Any]:
        client.workspace = str(private)
        try:
            client.hello()
        except RemoteError as exc:
            return {"code": exc.code, "message": str(exc)}
        return {"code": "accepted"}

    report = as_other_user(daemon.endpoint, attempt)
    assert report["code"] == "WORKSPACE_REFUSED", report
    assert f"uid {OTHER_UID} cannot open" in report["message"], report


def test_tilde_is_each_users_own_home_and_two_users_work_at_once(daemon: DaemonProcess) -> None:
    a_uid, a_gid, a_home = _user_with_home("a")
    b_uid, b_gid, b_home = _user_with_home("b")
    reports: dict[str, dict[str, Any]] = {}

    def session(tag: str, uid: int, gid: int, own: Path, other: Path) -> None:
        def act(client: Client) -> dict[str, Any]:
            client.workspace = str(own / "projects" / "app")
            welcome = client.hello()
            read = client.call("read_file", {"path": "mine.txt"})
            shell = client.call("shell", {"command": "id -u; pwd; cat mine.txt"})
            with Client(client.endpoint, timeout=10, workspace=other / "projects" / "app") as intruder:
                try:
                    intruder.hello()
                    crossed = "accepted"
                except RemoteError as exc:
                    crossed = exc.code
            return {"roots": welcome.roots, "read": read.content, "shell": shell.content, "crossed": crossed}

        reports[tag] = as_user(daemon.endpoint, uid, gid, act)

    threads = [
        threading.Thread(target=session, args=("a", a_uid, a_gid, a_home, b_home)),
        threading.Thread(target=session, args=("b", b_uid, b_gid, b_home, a_home)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for tag, uid, home in (("a", a_uid, a_home), ("b", b_uid, b_home)):
        report = reports[tag]
        assert report.get("exception") is None, report
        assert report["roots"] == [str(home / "projects" / "app")]
        assert f"{tag}'s file" in report["read"]
        assert report["shell"].split()[:2] == [str(uid), str(home / "projects" / "app")], report["shell"]
        assert report["crossed"] == "WORKSPACE_REFUSED"  # "~" is the asker's home, never another's
