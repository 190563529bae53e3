"""The daemon process: hostile input, identity, lifecycle, cancellation."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import msgspec
import psutil
import pytest
import zmq

import toold_protocol as p
from tests.conftest import BIN, DaemonProcess, start_daemon
from toold_client import Client, RemoteError
from toold_client._requests import Request


def raw_exchange(endpoint: str, frames: list[bytes], *, expect: int = 1, timeout_ms: int = 3000) -> list[bytes]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        replies = []
        for _ in range(expect):
            if not sock.poll(timeout_ms):
                break
            replies.append(sock.recv())
        return replies
    finally:
        sock.close()
        ctx.term()


def error_code(frame: bytes) -> tuple[str, int | None]:
    message = p.decode_daemon_message(frame)
    assert isinstance(message, p.Error)
    return message.code, message.id


@pytest.mark.parametrize(
    ("frames", "code", "request_id"),
    [
        ([b"\xc1\xc1garbage"], "MALFORMED_FRAME", None),
        ([p.encode_value({"type": "format_disk", "id": 9})], "UNKNOWN_MESSAGE_TYPE", 9),
        ([p.encode_value({"type": "submit_batch", "id": 10, "calls": "nope"})], "INVALID_MESSAGE", 10),
        (
            [p.encode_value({"type": "submit_batch", "id": 12, "calls": [], "outcome_in_acceptance": "yes"})],
            "INVALID_MESSAGE",
            12,
        ),
        ([p.encode(p.Ping(id=1)), b"second part"], "MULTIPART_NOT_ALLOWED", None),
        ([b"x" * (9 * 1024 * 1024)], "FRAME_TOO_LARGE", None),
        (
            [p.encode_value({"type": "confirm", "id": 11, "correlation_id": "c", "decision": "approve_all"})],
            "NOT_AUTHORIZED",
            11,
        ),
    ],
)
def test_hostile_frames_get_typed_errors_while_another_client_works(
    daemon: DaemonProcess, frames: list[bytes], code: str, request_id: int | None
) -> None:
    (daemon.root / "a.txt").write_text("fine")
    with daemon.client() as bystander:
        assert bystander.call("read_file", {"path": "a.txt"}).content == "fine"
        replies = raw_exchange(daemon.endpoint, frames)
        assert replies and error_code(replies[0]) == (code, request_id)
        assert bystander.call("read_file", {"path": "a.txt"}).content == "fine"
    assert daemon.proc.poll() is None


def test_many_hostile_frames_do_not_disturb_a_running_batch(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("fine")
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(20)]
    for s in socks:
        s.linger = 0
        s.connect(daemon.endpoint)
        s.send(os.urandom(64))
    with daemon.client() as client:
        for _ in range(20):
            assert client.call("read_file", {"path": "a.txt"}).ok
    for s in socks:
        assert s.poll(3000)
        assert error_code(s.recv())[0] == "MALFORMED_FRAME"
        s.close()
    ctx.term()


def test_welcome_carries_the_kernel_identity_not_a_claim(daemon: DaemonProcess) -> None:
    with daemon.client(client_name="pretending-to-be-root") as client:
        welcome = client.hello()
    assert welcome.identity == p.Identity(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    assert welcome.protocol_version == p.PROTOCOL_VERSION
    assert welcome.roots == [str(daemon.root.resolve())]


def test_old_protocol_version_is_refused(daemon: DaemonProcess) -> None:
    [reply] = raw_exchange(daemon.endpoint, [p.encode(p.Hello(id=5, protocol_version=0))])
    assert error_code(reply) == ("PROTOCOL_VERSION_UNSUPPORTED", 5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_peer_without_kernel_credentials_is_refused_by_zap() -> None:
    """A daemon no longer starts on TCP (see the test below), but the ZAP handler still
    refuses any peer whose address carries no kernel credentials, as a second line."""
    from toold_daemon.service.ipc import _zap_reply

    refused = _zap_reply([b"1.0", b"7", b"toold", b"127.0.0.1", b"", b"NULL"])
    assert refused[2] == b"400" and b"credentials" in refused[3]
    accepted = _zap_reply([b"1.0", b"8", b"toold", b"localhost:1000:1000:4242", b"", b"NULL"])
    assert accepted[2] == b"200" and accepted[4] == b"1000:1000:4242"


def test_second_daemon_on_the_same_endpoint_is_refused(daemon: DaemonProcess, tmp_path: Path) -> None:
    (tmp_path / "s2").mkdir()
    second = subprocess.run(
        [
            str(BIN / "toold"),
            "serve",
            "--root",
            str(daemon.root),
            "--endpoint",
            daemon.endpoint,
            "--state-dir",
            str(tmp_path / "s2"),
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert second.returncode == 1 and "another toold" in second.stderr
    with daemon.client() as client:
        assert client.ping() < 1.0


def test_sigterm_exits_zero_and_removes_the_socket(daemon: DaemonProcess) -> None:
    assert daemon.socket.exists()
    assert daemon.stop(signal.SIGTERM) == 0
    assert not daemon.socket.exists()
    assert not daemon.socket.with_name("toold.sock.lock").exists()


def test_sigint_also_exits_zero(daemon: DaemonProcess) -> None:
    assert daemon.stop(signal.SIGINT) == 0


def test_ready_quickly_after_exec(tmp_path: Path, root: Path) -> None:
    started = time.monotonic()
    daemon = start_daemon(tmp_path, root)
    elapsed = time.monotonic() - started
    daemon.stop()
    assert elapsed < 1.5, f"daemon took {elapsed:.3f}s to answer its first ping"


def submit_raw(client: Client, calls: list[p.ToolCall], **fields: object) -> p.BatchAccepted:
    """Submit without waiting for the batch, so a test can act while it runs."""
    accepted = client._request(Request(p.SubmitBatch, {"calls": calls, **fields}))
    assert isinstance(accepted, p.BatchAccepted)
    return accepted


def grep_calls(count: int) -> list[p.ToolCall]:
    arguments = msgspec.Raw(p.encode_value({"pattern": "needle", "max_results": 10_000}))
    return [p.ToolCall(call_id=f"c{i}", name="grep", arguments=arguments) for i in range(count)]


def big_tree(root: Path, files: int = 4000) -> None:
    for i in range(files):
        d = root / f"d{i % 40}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}.txt").write_text("some text with a needle in it\n" * 20)


def test_cancel_resolves_every_call(daemon: DaemonProcess) -> None:
    big_tree(daemon.root)
    with daemon.client() as client:
        accepted = submit_raw(client, grep_calls(8))
        client.cancel(accepted.batch_id)
        finished = client.wait_batch(accepted.batch_id, timeout=30)
        assert [r.call_id for r in finished.results] == [f"c{i}" for i in range(8)]
        assert finished.state == "cancelled"
        assert finished.results[-1].error is not None and finished.results[-1].error.type == "Cancelled"
        status = client.get_batch(accepted.batch_id)
        assert status.state == "cancelled" and len(status.results) == 8


def test_a_batch_of_no_calls_is_accepted_and_finishes_empty(daemon: DaemonProcess) -> None:
    """The protocol sets no least number of calls: none is a batch like any, for every
    way a client may ask to hear of it."""
    (daemon.root / "a.txt").write_text("after\n")
    with daemon.client() as client:
        for events in ("results", "all"):
            accepted = submit_raw(client, [], events=events)
            assert accepted.calls == []
            finished = client.wait_batch(accepted.batch_id, timeout=10)
            assert finished.state == "finished" and finished.results == []
        assert client.call("read_file", {"path": "a.txt"}).ok, "and the daemon serves on"


def test_unknown_batch_and_exactly_once_batch_ids(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("A")
    calls = [{"id": "r1", "name": "read_file", "arguments": {"path": "a.txt"}}]
    with daemon.client() as client:
        with pytest.raises(RemoteError) as info:
            client.get_batch("no-such-batch")
        assert info.value.code == "UNKNOWN_BATCH"
        first = client.submit(calls, batch_id="mine-1")
        (daemon.root / "a.txt").write_text("changed")  # a re-run would now read this
        again = client.submit(calls, batch_id="mine-1")
        assert again.results == first.results and again.results[0].content == "A"
        with pytest.raises(RemoteError) as dup:
            client.submit([{"id": "r1", "name": "read_file", "arguments": {"path": "b.txt"}}], batch_id="mine-1")
        assert dup.value.code == "DUPLICATE_BATCH_ID"
    with daemon.client() as stranger_session:  # same uid, new session: the same answer
        assert stranger_session.submit(calls, batch_id="mine-1").results == first.results


def test_sigterm_during_a_batch_answers_the_client(tmp_path: Path, root: Path) -> None:
    big_tree(root, 3000)
    daemon = start_daemon(tmp_path, root, config="[daemon]\nshutdown_grace_seconds = 0\n")
    with daemon.client() as client:
        accepted = submit_raw(client, grep_calls(8))
        daemon.proc.send_signal(signal.SIGTERM)
        finished = client.wait_batch(accepted.batch_id, timeout=20)
    assert len(finished.results) == 8
    assert daemon.proc.wait(timeout=10) == 0
    errors = [r.error.message for r in finished.results if r.error is not None]
    assert any("shutting down" in m for m in errors), json.dumps(errors)


def test_a_vanished_client_loses_nothing_and_disturbs_nobody(daemon: DaemonProcess) -> None:
    big_tree(daemon.root, 2000)
    (daemon.root / "a.txt").write_text("A")
    calls = [
        p.ToolCall(call_id=f"c{i}", name="grep", arguments=msgspec.Raw(p.encode_value({"pattern": "needle"})))
        for i in range(4)
    ]
    ctx = zmq.Context()
    leaver = ctx.socket(zmq.DEALER)
    leaver.linger = 0
    leaver.connect(daemon.endpoint)
    leaver.send(p.encode(p.SubmitBatch(id=1, calls=calls, batch_id="left-behind")))
    assert leaver.poll(5000)
    assert isinstance(p.decode_daemon_message(leaver.recv()), p.BatchAccepted)
    leaver.close()
    ctx.term()
    with daemon.client() as other:
        assert other.call("read_file", {"path": "a.txt"}).content == "A"
        deadline = time.monotonic() + 20
        while (status := other.get_batch("left-behind")).state not in ("finished", "cancelled"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    # on_client_disconnect = "cancel" (the default): what had not run when the daemon
    # noticed is cancelled; every call still has exactly one result.
    assert [r.call_id for r in status.results] == ["c0", "c1", "c2", "c3"]
    for result in status.results:
        assert result.ok or (result.error is not None and "disconnected" in result.error.message)


def test_bad_config_exits_2(tmp_path: Path, root: Path) -> None:
    for text, words in [
        ("[tools]\nmax_tool_calls_per_bach = 1\n", "toold.toml:2:"),
        ("[tools]\nmode = 'parse_everything'\n", "parse_everything"),
    ]:
        cfg = tmp_path / "toold.toml"
        cfg.write_text(text)
        out = subprocess.run(
            [
                str(BIN / "toold"),
                "serve",
                "--root",
                str(root),
                "--endpoint",
                f"ipc://{tmp_path}/x.sock",
                "--config",
                str(cfg),
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert out.returncode == 2 and words in out.stderr, out.stderr
    missing_root = subprocess.run(
        [str(BIN / "toold"), "serve", "--root", str(tmp_path / "nope"), "--endpoint", f"ipc://{tmp_path}/y.sock"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert missing_root.returncode == 2 and "not a directory" in missing_root.stderr
    # The isolation probe's child starts before the roots are checked: it must not outlive the refusal.
    nope = str(tmp_path / "nope")
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if nope in " ".join(p.info["cmdline"] or [])]
    assert left == []


def test_disabled_mode_and_denylist(tmp_path: Path, root: Path) -> None:
    (root / "a.txt").write_text("A")
    daemon = start_daemon(tmp_path, root, config="[tools.approval]\ndenylist = ['grep']\n")
    try:
        with daemon.client() as client:
            denied = client.call("grep", {"pattern": "A"})
            assert denied.error is not None and denied.error.code == "DENIED_BY_POLICY"
            assert client.call("read_file", {"path": "a.txt"}).ok
    finally:
        daemon.stop()
    (tmp_path / "d2").mkdir()
    daemon = start_daemon(tmp_path / "d2", root, config="[tools]\nmode = 'disabled'\n")
    try:
        with daemon.client() as client:
            assert client.tools() == []
            off = client.call("read_file", {"path": "a.txt"})
            assert off.error is not None and off.error.code == "TOOLS_DISABLED"
    finally:
        daemon.stop()


def test_iterations_per_user_turn_are_limited(tmp_path: Path, root: Path) -> None:
    (root / "a.txt").write_text("A")
    daemon = start_daemon(tmp_path, root, config="[tools]\nmax_tool_iterations_per_user_turn = 2\n")
    try:
        with daemon.client() as client:

            def turn(turn_id: str) -> p.ToolResult:
                read = p.ToolCall(
                    call_id="c", name="read_file", arguments=msgspec.Raw(p.encode_value({"path": "a.txt"}))
                )
                accepted = submit_raw(client, [read], turn_id=turn_id)
                return client.wait_batch(accepted.batch_id).results[0]

            assert turn("t1").ok and turn("t1").ok
            third = turn("t1")
            assert third.error is not None and third.error.code == "LIMITS_EXCEEDED"
            assert turn("t2").ok
            layers = {layer.name: layer for layer in client.welcome.isolation}
            assert {"process", "privilege", "landlock", "seccomp", "network", "rlimits"} <= set(layers)
            assert layers["process"].available
    finally:
        daemon.stop()


def test_a_tcp_endpoint_is_refused_at_start_with_the_reason(tmp_path: Path) -> None:
    """A TCP peer has no kernel credentials: the daemon would refuse every client, so it
    does not start there (from the command line or the configuration)."""
    import subprocess

    from tests.conftest import BIN

    state = tmp_path / "state"
    state.mkdir()
    done = subprocess.run(
        [str(BIN / "toold"), "serve", "--endpoint", "tcp://127.0.0.1:5555", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "only ipc://" in done.stderr, done.stderr
    config = tmp_path / "c.toml"
    config.write_text('[daemon]\nendpoint = "tcp://127.0.0.1:5555"\n')
    checked = subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode != 0 and "only ipc://" in checked.stdout + checked.stderr
