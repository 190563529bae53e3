"""Exact where it counts: approvals per tool, precedence, checks before asking, binary
data and symlink targets, each against a real daemon."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import APPROVE_ALL

AUTO = """
[tools.approval]
mode = "auto"
denylist = ["move_file"]
"""
AUTO_ALLOWLISTED = """
[tools.approval]
mode = "auto"
allowlist = ["delete_file"]

[tools.output]
max_bytes = 4000
"""


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "auto", AUTO) as d:
        yield d


@pytest.fixture(scope="module")
def allowlisted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "allowlisted", AUTO_ALLOWLISTED) as d:
        yield d


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("delete_file", {"path": "victim.txt"}),
        ("shell", {"command": "true"}),
        ("run_code", {"language": "python", "code": "print(1)"}),
    ],
)
def test_high_risk_tools_ask_even_in_auto_mode(auto: DaemonProcess, tool: str, arguments: dict[str, object]) -> None:
    (auto.root / "victim.txt").write_text("v")
    with auto.client(timeout=30) as c:
        explained = c.explain(tool, arguments)
        assert explained.decision == "ask", explained
        assert "high-risk" in explained.reason
        assert (
            c.explain("write_file", {"path": "new.txt", "content": "x"}).decision == "allow"
        )  # auto still runs the rest


def test_the_allowlist_is_the_administrators_explicit_word(allowlisted: DaemonProcess) -> None:
    (allowlisted.root / "victim.txt").write_text("v")
    with allowlisted.client(timeout=30) as c:
        assert c.explain("delete_file", {"path": "victim.txt"}).decision == "allow"
        assert c.explain("shell", {"command": "true"}).decision == "ask"


def test_a_denylisted_call_with_a_bad_path_reports_the_denylist(auto: DaemonProcess) -> None:
    with auto.client(timeout=30) as c:
        result = c.call("move_file", {"source": "../../etc/passwd", "destination": "x"})
    assert result.error is not None and result.error.code == "DENIED_BY_POLICY", result
    assert "denylist" in result.content


def test_explain_gives_the_real_reason_an_allowed_write_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    with module_daemon(tmp_path_factory, "default", "") as d, d.client(timeout=30) as c:
        explained = c.explain("write_file", {"path": "fresh.txt", "content": "x"})
        assert explained.decision == "allow"
        assert explained.reason != "read-only" and "replaces nothing" in explained.reason
        assert c.explain("read_file", {"path": "fresh.txt"}).reason == "read-only"


@pytest.mark.parametrize(
    ("tool", "arguments", "code"),
    [
        ("move_file", {"source": "a.txt", "destination": "b.txt"}, "FILE_EXISTS"),
        ("write_file", {"path": "b.txt", "content": "new"}, "FILE_EXISTS"),
        ("apply_patch", {"patch": "*** Begin Patch\n" + "x" * 600_000 + "\n*** End Patch\n"}, "LIMITS_EXCEEDED"),
    ],
)
def test_nobody_is_asked_to_approve_a_call_certain_to_fail(
    tmp_path_factory: pytest.TempPathFactory, tool: str, arguments: dict[str, object], code: str
) -> None:
    with module_daemon(tmp_path_factory, "precheck", '[tools.approval]\npreset = "none"\n') as d:
        (d.root / "a.txt").write_text("a")
        (d.root / "b.txt").write_text("b")
        asked: list[object] = []
        with d.client(timeout=30) as c:
            result = c.call(tool, arguments, on_confirm=lambda request: asked.append(request) or APPROVE_ALL)
        assert asked == []
        assert result.error is not None and result.error.code == code, result
        assert (d.root / "a.txt").read_text() == "a" and (d.root / "b.txt").read_text() == "b"


def test_a_line_range_of_a_binary_file_is_bad_args(allowlisted: DaemonProcess) -> None:
    (allowlisted.root / "blob.bin").write_bytes(bytes(range(256)) * 4)
    with allowlisted.client(timeout=30) as c:
        result = c.call("read_file", {"path": "blob.bin", "start_line": 1, "end_line": 2})
    assert result.error is not None and result.error.code == "BAD_ARGS", result


def test_a_binary_file_too_large_for_one_result_comes_back_cut(allowlisted: DaemonProcess) -> None:
    raw = os.urandom(20_000)
    (allowlisted.root / "big.bin").write_bytes(raw)
    with allowlisted.client(timeout=30) as c:
        result = c.call("read_file", {"path": "big.bin"})
    assert result.ok and result.truncated, result.content[:200]
    assert len(result.content.encode()) <= 4000
    _header, rest = result.content.split("\n", 1)
    body, marker = rest.rsplit("\n", 1)
    shown = base64.b64decode(body)
    assert raw.startswith(shown) and len(shown) > 1000
    assert marker.startswith(f"[output truncated: {len(raw) - len(shown)} bytes")


def test_list_directory_never_reveals_where_an_outside_symlink_points(
    allowlisted: DaemonProcess, tmp_path: Path
) -> None:
    secret_place = tmp_path / "private-project-name"
    secret_place.mkdir()
    (allowlisted.root / "escape").symlink_to(secret_place)
    (allowlisted.root / "inside").symlink_to("victim-target.txt")
    with allowlisted.client(timeout=30) as c:
        result = c.call("list_directory", {"path": "."})
    assert "private-project-name" not in result.content
    assert result.data is not None
    targets = {e["name"]: e.get("target") for e in result.data["entries"] if e["type"] == "symlink"}
    assert targets["escape"] == "(outside the workspace)"
    assert targets["inside"] == "victim-target.txt"


def test_a_running_batch_is_running_everywhere(tmp_path_factory: pytest.TempPathFactory) -> None:
    """journal list, get_batch and the watch view all say `running` while a call runs."""
    import msgspec

    import toold_protocol as p
    from tests.e2e.test_daemon import submit_raw
    from toold_client.watch import WatchState

    sleeper = [p.ToolCall(call_id="s", name="shell", arguments=msgspec.Raw(p.encode_value({"command": "sleep 2"})))]
    watch = WatchState()
    config = '[tools.approval]\nallowlist = ["shell"]\n'
    with module_daemon(tmp_path_factory, "running", config) as d, d.client(timeout=30) as c:
        accepted = submit_raw(c, sleeper)
        watch.apply(p.BatchStatus(id=0, batch_id=accepted.batch_id, state="planned", calls=accepted.calls, results=[]))
        watch.apply(p.CallStarted(batch_id=accepted.batch_id, call_id="s", index=0, name="shell"))
        status = c.get_batch(accepted.batch_id)
        deadline = time.monotonic() + 5  # a loaded machine may take a moment to start the command
        while status.state == "planned" and time.monotonic() < deadline:
            time.sleep(0.02)
            status = c.get_batch(accepted.batch_id)
        listed = {b.batch_id: b.state for b in c.list_batches()}
        finished = c.wait_batch(accepted.batch_id)
        after = {b.batch_id: b.state for b in c.list_batches()}
    assert watch.batches[accepted.batch_id].state == "running"
    assert listed[accepted.batch_id] == "running" and status.state == "running"
    assert finished.state == "finished" and after[accepted.batch_id] == "finished"


def test_a_client_waiting_on_a_batch_notices_a_dead_daemon(tmp_path: Path) -> None:
    """The daemon is SIGKILLed mid-batch: the client fails within seconds with a clear
    error (toolctl: exit 2) instead of waiting forever."""
    import signal
    import subprocess
    import threading
    import time

    from tests.conftest import BIN, start_daemon
    from toold_client import DaemonUnavailable

    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config='[tools.approval]\nallowlist = ["shell"]\n')
    try:
        threading.Timer(1.0, lambda: d.proc.send_signal(signal.SIGKILL)).start()
        started = time.monotonic()
        with d.client(timeout=30) as c, pytest.raises(DaemonUnavailable, match="went away"):
            c.call("shell", {"command": "sleep 60"})
        assert time.monotonic() - started < 8
    finally:
        d.stop()
    (tmp_path / "again").mkdir()
    d = start_daemon(tmp_path / "again", root, config='[tools.approval]\nallowlist = ["shell"]\n')
    try:
        threading.Timer(1.0, lambda: d.proc.send_signal(signal.SIGKILL)).start()
        started = time.monotonic()
        cli = subprocess.run(
            [str(BIN / "toolctl"), "--endpoint", d.endpoint, "call", "shell", "--args", '{"command": "sleep 60"}'],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert cli.returncode == 2, (cli.stdout, cli.stderr)
        assert "went away" in cli.stderr
        assert time.monotonic() - started < 8
    finally:
        d.stop()


def test_tool_definitions_describe_their_structured_output(allowlisted: DaemonProcess) -> None:
    from toold_protocol import ToolDefinition

    with allowlisted.client(timeout=30) as c:
        definitions = {d.name: d for d in c.tools() if isinstance(d, ToolDefinition)}
        result = c.call("glob", {"pattern": "*.bin"})
    for name in ("read_file", "list_directory", "glob", "grep", "write_file", "shell", "run_code", "delete_file"):
        assert definitions[name].output.startswith("data: {"), (name, definitions[name].output)
    assert result.data is not None and set(result.data) == {"matches", "count", "truncated"}
