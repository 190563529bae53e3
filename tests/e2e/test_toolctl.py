"""toolctl against a real daemon: commands, output shapes, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import BIN, DaemonProcess

RESULT_KEYS = {"call_id", "ok", "content", "display", "error", "truncated", "duration_ms", "data"}


def toolctl(
    daemon: DaemonProcess | None, *args: str, stdin: str | None = None, endpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["TOOLD_ENDPOINT"] = endpoint or (daemon.endpoint if daemon else "ipc:///nonexistent/toold.sock")
    return subprocess.run(
        [str(BIN / "toolctl"), *args], input=stdin, capture_output=True, text=True, env=env, timeout=30
    )


def test_ping_and_call_exit_codes(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello\n")
    assert toolctl(daemon, "ping").returncode == 0
    ok = toolctl(daemon, "call", "read_file", "--args", '{"path": "a.txt"}')
    assert ok.returncode == 0 and ok.stdout == "hello\n"
    missing = toolctl(daemon, "call", "read_file", "--args", '{"path": "nope.txt"}', "--json")
    assert missing.returncode == 1
    result = json.loads(missing.stdout)
    assert set(result) == RESULT_KEYS and result["ok"] is False
    assert set(result["error"]) == {"type", "code", "message", "details"}
    assert result["error"]["type"] == "FileNotFound" and result["error"]["code"] == "FILE_NOT_FOUND"
    assert toolctl(daemon, "call", "read_file", "--args", "{not json").returncode == 2
    assert toolctl(daemon, "call", "read_file", "--args", "[1]").returncode == 2


def test_call_json_success_shape(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("x")
    out = toolctl(daemon, "call", "read_file", "--args", '{"path": "a.txt"}', "--json")
    result = json.loads(out.stdout)
    assert set(result) == RESULT_KEYS and result["ok"] and result["error"] is None and result["content"] == "x"


def test_batch_from_stdin_keeps_call_order(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("A")
    batch = [
        {"id": "one", "name": "read_file", "arguments": {"path": "a.txt"}},
        {"id": "two", "name": "unknown_tool", "arguments": {}},
        {"id": "three", "name": "ls", "arguments": {}},
    ]
    out = toolctl(daemon, "batch", "--json", stdin=json.dumps(batch))
    assert out.returncode == 1
    results = json.loads(out.stdout)
    assert [r["call_id"] for r in results] == ["one", "two", "three"]
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["error"]["code"] == "UNKNOWN_TOOL"


def test_batch_file_and_bad_batch(daemon: DaemonProcess, tmp_path: Path) -> None:
    (daemon.root / "a.txt").write_text("A")
    f = tmp_path / "b.json"
    f.write_text(json.dumps([{"id": "x", "name": "read_file", "arguments": {"path": "a.txt"}}]))
    assert toolctl(daemon, "batch", str(f)).returncode == 0
    assert toolctl(daemon, "batch", stdin='{"not": "a list"}').returncode == 2
    assert toolctl(daemon, "batch", str(tmp_path / "missing.json")).returncode == 2


def test_tools_in_every_format(daemon: DaemonProcess) -> None:
    text = toolctl(daemon, "tools")
    assert text.returncode == 0
    assert [line.split()[0] for line in text.stdout.splitlines()] == [
        "apply_patch",
        "delete_file",
        "edit_file",
        "glob",
        "grep",
        "list_directory",
        "memory",
        "move_file",
        "read_file",
        "read_many_files",
        "run_code",
        "shell",
        "shell_jobs",
        "web_fetch",
        "write_file",
        "write_todos",
    ]
    openai = json.loads(toolctl(daemon, "tools", "--format", "openai").stdout)
    assert openai[0]["type"] == "function" and openai[0]["function"]["name"] == "apply_patch"
    anthropic = json.loads(toolctl(daemon, "tools", "--format", "anthropic").stdout)
    assert "input_schema" in anthropic[8] and anthropic[8]["name"] == "read_file"
    gemini = json.loads(toolctl(daemon, "tools", "--format", "gemini").stdout)
    assert "additionalProperties" not in json.dumps(gemini)
    native = json.loads(toolctl(daemon, "tools", "--format", "json").stdout)
    assert native[3]["risk"] == "low" and native[3]["parameters"]["type"] == "object"
    assert {t["name"]: t["risk"] for t in native}["delete_file"] == "high"


def test_no_daemon_is_exit_2(tmp_path: Path) -> None:
    out = toolctl(None, "call", "read_file", "--args", "{}", endpoint=f"ipc://{tmp_path}/none.sock")
    assert out.returncode == 2 and "no daemon" in out.stderr
    waited = toolctl(None, "ping", "--wait", "0.3", endpoint=f"ipc://{tmp_path}/none.sock")
    assert waited.returncode == 2


def test_ping_wait_succeeds_once_the_daemon_starts(tmp_path: Path, root: Path) -> None:
    from tests.conftest import start_daemon

    sock = tmp_path / "run" / "toold.sock"
    waiter = subprocess.Popen(
        [str(BIN / "toolctl"), "--endpoint", f"ipc://{sock}", "ping", "--wait", "15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    daemon = start_daemon(tmp_path, root)
    try:
        assert waiter.wait(timeout=20) == 0
    finally:
        daemon.stop()


def test_terminal_content_is_sanitized_only_for_terminals(daemon: DaemonProcess) -> None:
    (daemon.root / "esc.txt").write_text("a\x1b]0;pwned\x07b\n")
    piped = toolctl(daemon, "call", "read_file", "--args", '{"path": "esc.txt"}')
    assert piped.stdout == "a\x1b]0;pwned\x07b\n"  # exact for pipes and programs
    as_json = json.loads(toolctl(daemon, "call", "read_file", "--args", '{"path": "esc.txt"}', "--json").stdout)
    assert "\x1b" in as_json["content"] and "\x1b" not in as_json["display"]
    assert sys.executable  # the terminal case is covered by test_output's sanitizer tests
