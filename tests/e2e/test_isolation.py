"""Isolated children for real: environment, Landlock, network, limits, killing, streaming.

One daemon serves the module (starting one costs about half a second); each test uses
its own files under the shared root.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

import toold_protocol as p
from tests.conftest import DaemonProcess, module_daemon, start_daemon
from tests.e2e.test_daemon import submit_raw
from toold_client import Client
from toold_daemon.isolation import kernel

CONFIG = """
[tools.approval]
allowlist = ["shell", "run_code"]

[tools.isolation]
address_space_mb = 1024
"""
SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-leak",
    "OPENAI_API_KEY": "sk-leak",
    "github_token": "ghp-leak",
    "MY_SERVICE_PASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "aws-leak",
    "BASH_ENV": "/tmp/evil-bash-env",
    "PYTHONSTARTUP": "/tmp/evil-startup.py",
}
landlock = pytest.mark.skipif(kernel.landlock_abi() == 0, reason="kernel without Landlock")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "isolation", CONFIG, env=SECRETS) as d:
        yield d


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with daemon.client(timeout=60) as c:
        yield c


def shell(client: Client, command: str, **extra: Any) -> p.ToolResult:
    return client.call("shell", {"command": command, **extra})


def run_code(client: Client, code: str, **extra: Any) -> p.ToolResult:
    return client.call("run_code", {"language": "python", "code": code, **extra})


def alive_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return [proc for proc in found if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE]


def test_success_reports_stdout_stderr_and_exit_code(client: Client) -> None:
    result = shell(client, "echo out; echo err >&2")
    assert result.ok, result.content
    assert result.content == "out\n[stderr]\nerr\n[exit code 0]"
    assert result.data is not None and result.data["exit_code"] == 0


def test_non_zero_exit_is_an_error_that_keeps_the_output(client: Client) -> None:
    result = shell(client, "echo partial; exit 7")
    assert not result.ok and result.error is not None
    assert (result.error.type, result.error.code) == ("ExecutionFailed", "NON_ZERO_EXIT")
    assert "partial" in result.content and "[exit code 7]" in result.content


def test_secrets_and_injection_variables_never_reach_a_child(client: Client) -> None:
    result = shell(client, "env")
    assert result.ok
    names = {line.split("=", 1)[0] for line in result.content.splitlines() if "=" in line}
    for name, value in SECRETS.items():
        assert name not in names and value not in result.content
    assert {"PATH", "HOME", "TMPDIR"} <= names
    coded = client.call(
        "run_code",
        {
            "language": "bash",
            "code": 'echo "$MY_TOKEN|${LD_PRELOAD:-unset}"',
            "env": {"MY_TOKEN": "given-by-caller", "LD_PRELOAD": "/tmp/evil.so"},
        },
    )
    assert coded.ok and coded.content.startswith("given-by-caller|unset")


@landlock
def test_landlock_keeps_writes_inside_the_roots(client: Client, daemon: DaemonProcess, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    name = f"inside-{uuid.uuid4().hex}.txt"
    result = shell(client, f"echo x > {outside}; echo y > {name}; cat /etc/hostname >/dev/null && echo read-ok")
    assert "Permission denied" in result.content
    assert not outside.exists()
    assert (daemon.root / name).read_text() == "y\n"
    assert "read-ok" in result.content


def test_run_code_network_is_off_by_default_and_proxied_when_asked(client: Client) -> None:
    """Off: no network at all. On: the default mode, proxy, where the only way out is the
    egress proxy (a direct connection finds nothing; the proxy variables are set)."""
    code = (
        "import os, socket\nprint(os.environ.get('HTTP_PROXY'))\nsocket.create_connection(('192.0.2.1', 80), timeout=2)"
    )
    off = run_code(client, code)
    on = run_code(client, code, network=True)
    assert not off.ok and "None" in off.content
    assert not on.ok and "http://127.0.0.1:" in on.content, on.content


def test_run_code_network_in_host_mode_reaches_the_host(tmp_path: Path, root: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        server.settimeout(20)
        try:
            while True:
                conn, _ = server.accept()
                conn.sendall(b"hello from 127.0.0.1\n")
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=5)\nprint(s.recv(100).decode())"
    d = start_daemon(tmp_path, root, config=CONFIG + '[tools.network]\nmode = "host"\n')
    try:
        with d.client(timeout=30) as client:
            off = run_code(client, code)
            on = run_code(client, code, network=True)
    finally:
        server.close()
        d.stop()
    assert not off.ok and "hello" not in off.content
    # Landlock's TCP rule (ABI 4) refuses first (EACCES); without it the empty network
    # namespace answers (ENETUNREACH), or the seccomp filter (EPERM).
    refusals = ("Permission denied", "Network is unreachable", "Operation not permitted")
    assert any(words in off.content for words in refusals), off.content
    assert on.ok and "hello from 127.0.0.1" in on.content


def test_seccomp_refuses_ptrace(client: Client) -> None:
    if kernel.seccomp_supported() is not None:
        pytest.skip("no seccomp table for this machine")
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(0, 0, 0, 0), os.strerror(ctypes.get_errno()))"
    )
    result = run_code(client, code)
    assert result.ok and "-1 Operation not permitted" in result.content


def test_memory_bomb_ends_in_an_error_and_the_daemon_keeps_serving(client: Client) -> None:
    result = run_code(client, "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))")
    assert not result.ok and "MemoryError" in result.content
    assert client.ping(timeout=5) > 0


def test_timeout_kills_the_whole_tree_including_escapees(client: Client) -> None:
    marker = f"31{uuid.uuid4().int % 10**6:06d}"
    command = (
        f"setsid sleep {marker}1 & nohup sleep {marker}2 >/dev/null 2>&1 & "
        f"(trap '' TERM; sleep {marker}3) & sh -c 'sleep {marker}4 &' ; "
        f"python3 -c 'import os; os.fork() or os.setsid(); import time; time.sleep({marker}5)' & "
        "echo started; sleep 60"
    )
    started = time.monotonic()
    result = shell(client, command, timeout_ms=1500)
    assert time.monotonic() - started < 10
    assert result.error is not None and result.error.type == "Timeout", result.content
    assert "started" in result.content  # the partial output is kept
    time.sleep(0.2)
    assert alive_with(marker) == []


def test_processes_left_behind_by_a_finished_command_are_killed(client: Client) -> None:
    marker = f"32{uuid.uuid4().int % 10**6:06d}"
    result = shell(client, f"setsid sleep {marker} > /dev/null 2>&1 < /dev/null & echo done")
    assert result.ok and "done" in result.content
    time.sleep(0.2)
    assert alive_with(marker) == []


def test_without_cgroups_the_token_sweep_still_kills_what_a_command_left_behind(tmp_path: Path, root: Path) -> None:
    """With a cgroup that held the whole call, emptying it ends the call and the token sweep
    is skipped; without one, the sweep is what finds the processes that left the group."""
    marker = f"36{uuid.uuid4().int % 10**6:06d}"
    d = start_daemon(tmp_path, root, config=CONFIG + "cgroups = false\n")
    try:
        with d.client(timeout=30) as c:
            command = (
                f"setsid sleep {marker}1 >/dev/null 2>&1 </dev/null & "
                f"nohup sleep {marker}2 >/dev/null 2>&1 </dev/null & "
                f"python3 -c 'import os, time; os.fork() or os.setsid(); time.sleep({marker}3)' & echo done"
            )
            result = c.call("shell", {"command": command})
            assert result.ok and "done" in result.content, result.content
            deadline = time.monotonic() + 5
            while alive_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert alive_with(marker) == []
    finally:
        d.stop()


def test_grandchild_holding_the_pipe_does_not_hang_the_call(client: Client) -> None:
    marker = f"33{uuid.uuid4().int % 10**6:06d}"
    started = time.monotonic()
    result = shell(client, f"(sleep {marker} &) ; echo quick")
    assert time.monotonic() - started < 5
    assert result.ok and "quick" in result.content
    assert alive_with(marker) == []


def test_idle_timeout(client: Client) -> None:
    result = shell(client, "echo a; sleep 30", idle_timeout_ms=500)
    assert result.error is not None and result.error.code == "IDLE_TIMEOUT", result.content
    assert "a" in result.content


def test_cancel_kills_the_command(client: Client) -> None:
    marker = f"34{uuid.uuid4().int % 10**6:06d}"
    args = msgspec.Raw(p.encode_value({"command": f"echo begun; sleep {marker}"}))
    accepted = submit_raw(client, [p.ToolCall(call_id="c", name="shell", arguments=args)])
    time.sleep(0.5)
    client.cancel(accepted.batch_id)
    finished = client.wait_batch(accepted.batch_id)
    result = finished.results[0]
    assert result.error is not None and result.error.type == "Cancelled"
    assert "begun" in result.content
    time.sleep(0.2)
    assert alive_with(marker) == []


def test_streaming_chunks_arrive_before_the_command_ends(client: Client) -> None:
    seen: list[tuple[float, Any]] = []
    client.submit(
        [{"name": "shell", "arguments": {"command": "echo first; sleep 1.5; echo second >&2"}}],
        on_event=lambda event: seen.append((time.monotonic(), event)),
    )
    chunks = [(t, e) for t, e in seen if isinstance(e, p.OutputChunk)]
    finished_at = next(t for t, e in seen if isinstance(e, p.CallFinished))
    assert [(e.stream, e.data) for _, e in chunks] == [("stdout", "first\n"), ("stderr", "second\n")]
    assert [e.seq for _, e in chunks] == [0, 1]
    assert finished_at - chunks[0][0] > 1.0


def test_a_gigabyte_of_output_is_truncated_and_the_daemon_stays_small(client: Client, daemon: DaemonProcess) -> None:
    daemon_process = psutil.Process(daemon.proc.pid)
    before = daemon_process.memory_info().rss
    streamed = 0

    def count(event: Any) -> None:
        nonlocal streamed
        if isinstance(event, p.OutputChunk):
            streamed += len(event.data)

    started = time.monotonic()
    outcome = client.submit(
        [
            {
                "name": "shell",
                "arguments": {"command": "yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 1000000000"},
            }
        ],
        on_event=count,
    )
    elapsed = time.monotonic() - started
    result = outcome.results[0]
    grown = daemon_process.memory_info().rss - before
    assert result.ok and result.truncated
    assert len(result.content.encode()) <= 102_400
    assert streamed <= 1_100_000  # streaming stops at the configured limit, with a note
    assert grown < 64 * 1024 * 1024, f"daemon RSS grew by {grown / 1e6:.1f} MB"
    assert elapsed < 60


def test_binary_output_is_shown_as_base64(client: Client) -> None:
    result = shell(client, "head -c 5000 /dev/urandom")
    assert result.ok and "[binary output: 5000 bytes as base64]" in result.content
    encoded = result.content.split("]\n", 1)[1].split("\n", 1)[0]
    assert len(__import__("base64").b64decode(encoded)) == 5000  # the bytes themselves, not a summary


def test_cwd_must_be_inside_the_roots(client: Client, daemon: DaemonProcess) -> None:
    (daemon.root / "sub").mkdir(exist_ok=True)
    inside = shell(client, "pwd", cwd="sub")
    assert inside.ok and inside.content.startswith(str(daemon.root / "sub"))
    outside = shell(client, "pwd", cwd="../..")
    assert outside.error is not None and outside.error.type == "SandboxViolation"


def test_welcome_reports_every_layer(client: Client) -> None:
    layers = {layer.name: layer for layer in client.hello().isolation}
    assert layers["process"].available
    for name in ("landlock", "seccomp", "network", "rlimits", "no_new_privs", "privilege"):
        assert name in layers and layers[name].detail


def test_a_required_layer_that_is_off_refuses_every_tool(tmp_path: Path, root: Path) -> None:
    config = CONFIG + 'require = ["cgroup"]\ncgroups = false\n'
    d = start_daemon(tmp_path, root, config=config)
    try:
        with d.client(timeout=30) as c:
            result = c.call("shell", {"command": "echo should-not-run"})
            read = c.call("list_directory", {"path": "."})
    finally:
        d.stop()
    assert result.error is not None and result.error.type == "IsolationUnavailable"
    assert "cgroup" in result.error.message and "should-not-run" not in result.content
    # reads run under the same confinement as commands: no layer, no read
    assert read.error is not None and read.error.type == "IsolationUnavailable", read
    assert "cgroup" in read.error.message


def test_daemon_shutdown_kills_running_commands(tmp_path: Path, root: Path) -> None:
    marker = f"35{uuid.uuid4().int % 10**6:06d}"
    # no grace: the command is still running when shutdown cancels it
    d = start_daemon(tmp_path, root, config=CONFIG + "\n[daemon]\nshutdown_grace_seconds = 0\n")
    try:
        with d.client(timeout=30) as c:
            args = msgspec.Raw(p.encode_value({"command": f"setsid sleep {marker} & sleep {marker}"}))
            submit_raw(c, [p.ToolCall(call_id="c", name="shell", arguments=args)])
            deadline = time.monotonic() + 5
            while not alive_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert alive_with(marker)
            assert d.stop() == 0
    finally:
        d.stop()
    time.sleep(0.3)
    assert alive_with(marker) == []


def test_toold_doctor_reports_every_layer(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import BIN

    done = subprocess.run([str(BIN / "toold"), "doctor"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    layer_names = set(json.loads(subprocess.check_output([str(BIN / "toold"), "doctor", "--json"]))["layers"])
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines() if line.split()[0] in layer_names}
    assert set(rows) == {
        "capabilities", "cgroup", "landlock", "network", "no_new_privs", "privilege", "processes", "rlimits",
        "seccomp", "signals",
    }  # fmt: skip
    assert rows["landlock"] == ("on" if kernel.landlock_abi() else "off"), done.stdout
    assert rows["no_new_privs"] == "on"
    strict = tmp_path / "strict.toml"
    strict.write_text('[tools.isolation]\nrequire = ["cgroup"]\ncgroups = false\n')
    refused = subprocess.run(
        [str(BIN / "toold"), "doctor", "--config", str(strict)], capture_output=True, text=True, timeout=30, check=False
    )
    assert refused.returncode == 1 and "required but off: cgroup" in refused.stderr


def test_background_jobs_list_read_kill_and_die_with_the_daemon(tmp_path: Path, root: Path) -> None:
    marker = f"36{uuid.uuid4().int % 10**6:06d}"  # the job that shell_jobs kills
    other = f"37{uuid.uuid4().int % 10**6:06d}"  # the job the daemon's shutdown kills
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=30) as c:
            quick = c.call("shell", {"command": "echo hello-from-bg; echo err >&2", "background": True})
            assert quick.ok and quick.data is not None
            quick_id = quick.data["job_id"]
            slow = c.call("shell", {"command": f"echo begun; sleep {marker}", "background": True})
            slow_id = slow.data["job_id"]  # type: ignore[index]
            survivor = c.call("shell", {"command": f"setsid sleep {other}1 & sleep {other}2", "background": True})
            assert survivor.ok
            deadline = time.monotonic() + 10
            while True:
                read = c.call("shell_jobs", {"action": "output", "job_id": quick_id})
                if "[exited, exit code 0]" in read.content or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert "hello-from-bg" in read.content and "[exited, exit code 0]" in read.content
            listed = c.call("shell_jobs", {"action": "list"})
            assert {quick_id, slow_id} <= {j["job_id"] for j in listed.data["jobs"]}  # type: ignore[index]
            assert alive_with(marker)
            c.call("shell_jobs", {"action": "kill", "job_id": slow_id})
            time.sleep(0.5)
            assert alive_with(marker) == []
            state = c.call("shell_jobs", {"action": "output", "job_id": slow_id})
            assert "[killed" in state.content and "begun" in state.content
            unknown = c.call("shell_jobs", {"action": "output", "job_id": "job_999"})
            assert unknown.error is not None and unknown.error.code == "UNKNOWN_JOB"
            assert alive_with(f"{other}1") and alive_with(f"{other}2")
    finally:
        assert d.stop() == 0
    time.sleep(0.3)
    assert alive_with(other) == []  # the daemon's shutdown killed the rest, escapee included


def test_without_network_namespaces_seccomp_still_cuts_the_network(tmp_path: Path, root: Path) -> None:
    if kernel.seccomp_supported() is not None:
        pytest.skip("no seccomp table for this machine")
    config = CONFIG + "network_namespace = false\n"
    d = start_daemon(tmp_path, root, config=config)
    code = (
        "import socket\n"
        "for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),"
        " (socket.AF_INET6, socket.SOCK_STREAM)):\n"
        "    try:\n        socket.socket(family, kind)\n        print('opened', family, kind)\n"
        "    except OSError as exc:\n        print('refused', exc.errno)\n"
        "try:\n    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n    print('unix opened')\n"
        "except OSError as exc:\n    print('unix: refused', exc.errno)\n"
        "a, b = socket.socketpair()\na.send(b'x')\nprint('pair ok', b.recv(1))\n"
    )
    try:
        with d.client(timeout=30) as c:
            result = c.call("run_code", {"language": "python", "code": code})
            layers = {layer.name: layer.detail for layer in c.hello().isolation}
    finally:
        d.stop()
    assert result.ok, result.content
    assert result.content.splitlines().count("refused 1") == 3 and "opened" not in result.content
    assert "unix: refused 1" in result.content  # network off: the daemon's socket family too
    assert "pair ok" in result.content  # a connected pair reaches nothing outside the call
    assert "seccomp" in layers["network"]


def test_chatty_output_is_coalesced_and_nothing_is_lost(client: Client) -> None:
    chunks: list[p.OutputChunk] = []
    outcome = client.submit(
        [{"name": "shell", "arguments": {"command": "i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done"}}],
        on_event=lambda e: chunks.append(e) if isinstance(e, p.OutputChunk) else None,
    )
    streamed = "".join(c.data for c in chunks)
    assert streamed == "".join(f"line{i}\n" for i in range(3000))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.coalesced >= 1 for c in chunks) and len(chunks) < 3000  # merged, not one per line
    assert outcome.results[0].ok


def test_per_call_cgroup_kills_an_escapee_that_cleared_its_environment(client: Client) -> None:
    layers = {layer.name: layer for layer in client.hello().isolation}
    if not layers["cgroup"].available:
        pytest.skip(f"no per-call cgroups here: {layers['cgroup'].detail}")
    marker = f"38{uuid.uuid4().int % 10**6:06d}"
    # The pause lets setsid take effect: without a cgroup this process would survive the call.
    command = f"grep '^0::' /proc/self/cgroup; setsid env -i sleep {marker} >/dev/null 2>&1 </dev/null & sleep 0.3"
    result = shell(client, command)
    assert result.ok, result.content
    time.sleep(0.3)
    assert alive_with(marker) == []
    base = Path(layers["cgroup"].detail.split("under ")[1].split(";")[0])
    call_cgroup = base / result.content.split("\n")[0].rsplit("/", 1)[1]
    assert call_cgroup.name.startswith("call-")
    for group in (call_cgroup, call_cgroup / call_cgroup.name):  # its innermost, in the unified hierarchy
        assert not group.exists() or (group / "cgroup.procs").read_text() == ""  # emptied: kept or removed


def test_a_command_gets_no_descriptor_but_its_own_three(client: Client) -> None:
    """The channel to the daemon stays with the supervisor: a command cannot forge results."""
    result = shell(client, "ls /proc/$$/fd; for fd in 3 4 5 6 7 8 9; do echo forged >&$fd; done 2>/dev/null; echo end")
    assert result.ok, result.content
    assert result.content.split("\n")[:4] == ["0", "1", "2", "end"]


def test_garbage_on_the_channel_is_a_typed_failure() -> None:
    from toold_daemon.isolation.child_output import ChildFailed, decode_frames
    from toold_daemon.isolation.wire import MAX_FRAME, FrameBuffer

    with pytest.raises(ChildFailed, match="malformed message"):
        decode_frames(FrameBuffer(), (5).to_bytes(4, "big") + b"\xc1\xc1\xc1\xc1\xc1")
    with pytest.raises(ChildFailed, match="over the limit"):
        decode_frames(FrameBuffer(), (MAX_FRAME + 1).to_bytes(4, "big"))


def test_every_call_starts_with_an_empty_private_tmpdir(client: Client) -> None:
    """Temp dirs are reused for speed, but only when the call left its own untouched."""
    seen = set()
    for command in ("touch $TMPDIR/left-behind; chmod 755 $TMPDIR", "true", "mkdir $TMPDIR/sub", "true", "true"):
        result = shell(client, f'ls -A "$TMPDIR"; stat -c "%a" "$TMPDIR"; echo "$TMPDIR"; {command}')
        assert result.ok, result.content
        listing_and_mode, tmpdir = result.data["stdout"].rsplit("\n", 2)[0], result.data["stdout"].split()[-1]
        assert listing_and_mode == "700", f"{tmpdir} was not fresh: {listing_and_mode!r}"
        seen.add(tmpdir)
    assert len(seen) >= 3  # the touched ones were not handed out again
