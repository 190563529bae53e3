"""The spawner, the only process that keeps root, checks every request on its own: a
compromised protocol process (or a tool that got hold of the spawner's socket) must not
get a child for a uid the administrator did not admit, on roots that uid may not use,
or at all when the request does not come from the protocol process itself.

These tests are the protocol process: they start a real spawner and talk to it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from toold_daemon.config import Config
from toold_daemon.isolation.admission import Admission
from toold_daemon.isolation.cgroup import call_bases_of
from toold_daemon.isolation.spawner import start
from toold_daemon.isolation.wire import (
    Outcome,
    Spawned,
    SpawnRequest,
    TempDone,
    TempWanted,
    child_decoder,
    frame,
    read_frame,
)
from toold_daemon.tools.builtin import builtin_tools

_spawned = msgspec.msgpack.Decoder(Spawned)
_config = msgspec.msgpack.encode(Config())
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the spawner changes uid only as root")


@pytest.fixture
def places() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory() as daemon_root, tempfile.TemporaryDirectory() as elsewhere:
        yield Path(daemon_root), Path(elsewhere)


def spawner(admission: Admission) -> socket.socket:
    """A real spawner for ``admission``; we hold the protocol process's end."""
    return start(list(builtin_tools()), admission)[1]


def ask(control: socket.socket, request: SpawnRequest) -> Spawned:
    """Send one request with a fresh channel; the spawner's reply (a started child's
    first frame must be its outcome, which shows it ran)."""
    read_end, write_end = os.pipe()
    control.sendmsg([frame(request)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, write_end.to_bytes(4, "little"))])
    os.close(write_end)
    header = _recv_exact(control, 4)
    reply = _spawned.decode(_recv_exact(control, int.from_bytes(header, "big")))
    if reply.pid:
        body = read_frame(read_end)
        assert body is not None and isinstance(child_decoder.decode(body), Outcome)
    os.close(read_end)
    return reply


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the spawner closed its socket"
        data += chunk
    return data


def listing(root: Path, uid: int) -> SpawnRequest:
    return SpawnRequest(
        call_id="c1",
        token="t" * 24,
        tool="list_directory",
        args=msgspec.msgpack.encode({"path": "."}),
        config=_config,
        roots=[str(root)],
        uid=uid,
        gid=uid,
        network=False,
    )


def test_a_uid_outside_the_admitted_set_is_refused(places: tuple[Path, Path]) -> None:
    """The protocol process asks for a child as a uid the config does not admit."""
    daemon_root, _ = places
    control = spawner(Admission(daemon_roots=(str(daemon_root),), allowed_uids=(4242,)))
    try:
        refused = ask(control, listing(daemon_root, 4343))
        assert refused.pid == 0 and "uid 4343 may not use this daemon" in refused.error
        admitted = ask(control, listing(daemon_root, 4242))
        assert admitted.pid > 0, admitted.error
    finally:
        control.close()


def test_root_is_refused_unless_root_clients_are_allowed(places: tuple[Path, Path]) -> None:
    daemon_root, _ = places
    control = spawner(Admission(daemon_roots=(str(daemon_root),), allow_root_clients=False))
    try:
        refused = ask(control, listing(daemon_root, 0))
        assert "uid 0 may not use this daemon" in refused.error
    finally:
        control.close()
    control = spawner(Admission(daemon_roots=(str(daemon_root),), allow_root_clients=True))
    try:
        admitted = ask(control, listing(daemon_root, 0))
        assert admitted.pid > 0, admitted.error
    finally:
        control.close()


def test_roots_that_uid_may_not_use_are_refused(places: tuple[Path, Path]) -> None:
    """An admitted uid, but roots outside the daemon's roots and its allowed places:
    outright, by a parent of an allowed place, and by a sibling that shares a prefix."""
    daemon_root, elsewhere = places
    admission = Admission(daemon_roots=(str(daemon_root),), allowed_uids=(4242,))
    control = spawner(admission)
    try:
        for bad in (elsewhere, daemon_root.parent, Path(str(daemon_root) + "-evil"), Path("/")):
            refused = ask(control, listing(bad, 4242))
            assert refused.pid == 0 and "may not use" in refused.error, (bad, refused)
        inside = daemon_root / "sub"
        inside.mkdir()
        admitted = ask(control, listing(inside, 4242))
        assert admitted.pid > 0, admitted.error
    finally:
        control.close()


def test_tilde_places_are_each_uids_own_home() -> None:
    """``~`` in allowed_roots is the asking uid's home: root's home is no place for 4242."""
    control = spawner(Admission(allowed_roots=("~",), allowed_uids=(4242,), allow_root_clients=True))
    try:
        root_home = Path(os.path.expanduser("~root"))
        refused = ask(control, listing(root_home, 4242))
        assert "may not use" in refused.error
        admitted = ask(control, listing(root_home, 0))
        assert admitted.pid > 0, admitted.error
    finally:
        control.close()


def test_a_request_not_sent_by_the_protocol_process_is_refused(places: tuple[Path, Path]) -> None:
    """A process that got hold of the spawner's socket (inherited, or passed to it) sends a
    well-formed request for an admitted uid: the kernel names it as the sender, and the
    spawner refuses it. The protocol process's own next request is served."""
    daemon_root, _ = places
    control = spawner(Admission(daemon_roots=(str(daemon_root),), allowed_uids=(4242,)))
    try:
        child = os.fork()
        if child == 0:  # the intruder
            code = 1
            try:
                reply = ask(control, listing(daemon_root, 4242))
                code = 0 if reply.pid == 0 and "not the daemon's" in reply.error else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the spawner served a request from another process"
        admitted = ask(control, listing(daemon_root, 4242))
        assert admitted.pid > 0, admitted.error
    finally:
        control.close()


def chore(control: socket.socket, message: TempWanted | TempDone) -> Spawned:
    control.sendall(frame(message))
    header = _recv_exact(control, 4)
    return _spawned.decode(_recv_exact(control, int.from_bytes(header, "big")))


def test_temp_dirs_only_for_admitted_uids_and_only_its_own_taken_back(tmp_path: Path) -> None:
    """An unprivileged daemon asks the spawner for calls' temp dirs. It gets them only for
    admitted uids, and can hand back only one the spawner lent: never a path of its choice
    (which the spawner, as root, would otherwise remove)."""
    control = spawner(Admission(allowed_uids=(4242,)))
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    try:
        refused = chore(control, TempWanted(uid=4343, gid=4343))
        assert refused.path == "" and "uid 4343 may not use" in refused.error
        lent = chore(control, TempWanted(uid=4242, gid=4242))
        assert lent.path and not lent.error
        made = Path(lent.path)
        assert made.is_dir() and made.stat().st_uid == 4242 and (made.stat().st_mode & 0o777) == 0o700
        forged = chore(control, TempDone(path=str(victim), reusable=False))
        assert "not a temp dir this spawner lent" in forged.error
        assert (victim / "keep.txt").read_text() == "mine"
        (made / "left-behind").write_text("x")
        assert chore(control, TempDone(path=lent.path, reusable=True)).error == ""
        assert not made.exists()  # touched: removed, not pooled
        again = chore(control, TempDone(path=lent.path))
        assert "not a temp dir this spawner lent" in again.error  # once only
    finally:
        control.close()


def test_children_join_only_the_daemons_own_call_cgroups(places: tuple[Path, Path]) -> None:
    """A child joins its cgroups as root, before it drops to the client: a compromised
    protocol process must not be able to put a client's process into a cgroup of its
    choosing (another service's, to escape its limits, or to be killed with it). Only
    ``call-``/``zygote-``/``worker-`` cgroups right below the daemon's own base pass, and
    the innermost one of the same name inside each."""
    daemon_root, _ = places
    control = spawner(Admission(daemon_roots=(str(daemon_root),), allowed_uids=(4242,)))
    bases = sorted(call_bases_of(os.getpid()))  # we are the daemon this spawner serves
    assert bases, "no cgroup hierarchy is mounted here"
    base = bases[0]
    try:
        for bad in (
            os.path.dirname(base),  # the daemon's own cgroup
            base,
            f"{base}/../elsewhere",
            f"{base}/call-00/../../call-00",
            f"{base}/call-00/nested",
            f"{base}/call-00/call-01",  # an innermost cgroup has its call cgroup's name
            f"{base}/call-00/call-00/call-00",
            f"{base}/elsewhere/call-00",
            f"{base}/shell-00",
            f"{base}-evil/call-00",
            "/sys/fs/cgroup/system.slice/ssh.service",
        ):
            refused = ask(control, msgspec.structs.replace(listing(daemon_root, 4242), cgroups=[bad]))
            assert refused.pid == 0 and "not one of the daemon's call cgroups" in refused.error, (bad, refused)
        for good in (f"{base}/call-00", f"{base}/call-00/call-00"):
            fine = ask(control, msgspec.structs.replace(listing(daemon_root, 4242), cgroups=[good]))
            assert fine.pid > 0, (good, fine.error)
    finally:
        control.close()


def test_a_spawner_of_its_own_serves_the_service_user_alone(tmp_path: Path) -> None:
    """``toold spawner`` (the system package's root unit) answers only the uid the
    protocol process runs as: root itself, connecting to its socket, gets the connection
    closed before a request is read; the service user's connection is served."""
    from tests.conftest import BIN
    from tests.e2e.test_privilege_separation import CONFIG, service_user

    uid, gid = service_user()
    shared = Path(tempfile.mkdtemp(prefix="toold-spawner-"))
    os.chmod(shared, 0o711)
    (shared / "toold.toml").write_text(CONFIG)
    path = shared / "spawner" / "spawner.sock"
    workspace = shared / "workspace"
    workspace.mkdir(mode=0o755)
    log = (tmp_path / "spawner.log").open("wb")
    args = ["--config", str(shared / "toold.toml"), "--spawner-socket", str(path), "--root", str(workspace)]
    proc = subprocess.Popen([str(BIN / "toold"), "spawner", *args], stderr=log)
    try:
        while not path.exists():
            assert proc.poll() is None, (tmp_path / "spawner.log").read_text()
            time.sleep(0.02)
        assert (path.stat().st_uid, path.stat().st_mode & 0o777) == (uid, 0o600)
        assert (path.parent.stat().st_gid, path.parent.stat().st_mode & 0o777) == (gid, 0o750)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
            stranger.connect(str(path))  # root may connect whatever the mode; it is not served
            stranger.settimeout(10)
            try:
                assert stranger.recv(1) == b""
            except ConnectionResetError:
                pass

        def served(control: socket.socket) -> bool:
            return ask(control, listing(workspace, 0)).pid > 0

        def dropped(control: socket.socket) -> bool:
            control.sendall(b"\xff\xff\xff\xff")  # a frame over the limit
            control.settimeout(10)
            return control.recv(1) == b""

        # The service user is served; a broken (or hostile) one loses its connection, and
        # the spawner lives on to serve the next.
        for attempt in (served, dropped, served):
            assert as_service_user(str(path), uid, gid, attempt), (tmp_path / "spawner.log").read_text()
            assert proc.poll() is None
        assert "refused a connection from pid" in (tmp_path / "spawner.log").read_text()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(shared, ignore_errors=True)


def as_service_user(path: str, uid: int, gid: int, attempt: Callable[[socket.socket], bool]) -> bool:
    """Connect to the spawner at ``path`` from a child running as ``uid`` (as the protocol
    process would) and report what ``attempt`` says of the connection."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
                control.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                control.connect(path)
                code = 0 if attempt(control) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_serve_trusts_no_spawner_socket_another_user_planted(tmp_path: Path) -> None:
    """Another local user listens at the spawner's path, hoping to receive the protocol
    process's requests (and learn every call): ``serve`` checks the peer's uid and stops
    with a clear error before it sends a byte. A relative socket path is refused too."""
    from tests.conftest import BIN
    from tests.e2e.test_identity import OTHER_GID, OTHER_UID

    shared = Path(tempfile.mkdtemp(prefix="toold-planted-"))
    os.chmod(shared, 0o777)  # the attacker's writable place
    path = shared / "spawner.sock"
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the other user's fake spawner
        try:
            os.setgroups([])
            os.setresgid(OTHER_GID, OTHER_GID, OTHER_GID)
            os.setresuid(OTHER_UID, OTHER_UID, OTHER_UID)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            listener.listen(1)
            os.write(ready_w, b"1")
            conn, _ = listener.accept()
            conn.settimeout(5)
            os._exit(7 if conn.recv(1) else 0)  # 7: it received something
        except BaseException:
            os._exit(1)
    try:
        assert os.read(ready_r, 1) == b"1"
        done = subprocess.run(
            [str(BIN / "toold"), "serve", "--spawner-socket", str(path), "--root", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2 and "not a spawner we trust" in done.stderr, done.stderr
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the planted spawner received a request"
        relative = subprocess.run(
            [str(BIN / "toold"), "spawner", "--spawner-socket", "spawner.sock"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert relative.returncode == 2 and "must be absolute" in relative.stderr, relative.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)
