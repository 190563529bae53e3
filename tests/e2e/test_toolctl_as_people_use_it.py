"""toolctl as people use it: output streamed live on a terminal (a real pseudo-terminal)
with a progress line while a call is silent, a closed pipe ended quietly, --version,
shell completion generated from the parsers, --json with the result's data, and
--log-level in any case."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

from tests.conftest import BIN, DaemonProcess

CONFIG_ALLOWING_SHELL = '[tools.approval]\nallowlist = ["shell"]\n'


def on_a_terminal(daemon: DaemonProcess, *args: str, timeout: float = 30) -> list[tuple[float, bytes]]:
    """Run toolctl with stdout and stderr on a pseudo-terminal; what it wrote, and when."""
    main, secondary = pty.openpty()
    env = {**os.environ, "TOOLD_ENDPOINT": daemon.endpoint, "TERM": "xterm"}
    proc = subprocess.Popen([str(BIN / "toolctl"), *args], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    started, chunks = time.monotonic(), []
    deadline = started + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.1)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the terminal closed: toolctl exited
                    break
                if not data:
                    break
                chunks.append((time.monotonic() - started, data))
            elif proc.poll() is not None:
                break
    finally:
        os.close(main)
        proc.wait(timeout=10)
    chunks.append((time.monotonic() - started, b""))
    return chunks


def test_call_streams_output_live_and_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    from tests.conftest import start_daemon

    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=CONFIG_ALLOWING_SHELL)
    try:
        command = json.dumps({"command": "echo first-line; sleep 2.5; echo second-line"})
        chunks = on_a_terminal(d, "call", "shell", "--args", command)
    finally:
        d.stop()
    ended = chunks[-1][0]
    text = b"".join(data for _, data in chunks).decode()
    first_seen = next(at for at, data in chunks if b"first-line" in data)
    assert ended - first_seen > 1.5, "the first line came only at the end"
    assert "running: shell" in text, text  # the progress line during the silent sleep
    assert text.count("first-line") == 1 and text.count("second-line") == 1  # not printed again at the end
    assert "[exit code 0]" in text


def test_piped_output_stays_exact_and_json_carries_data(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello\n")
    env = {**os.environ, "TOOLD_ENDPOINT": daemon.endpoint}
    plain = subprocess.run(
        [str(BIN / "toolctl"), "call", "read_file", "--args", '{"path": "a.txt"}'],
        capture_output=True,
        env=env,
        timeout=30,
    )
    assert plain.stdout == b"hello\n" and plain.stderr == b""
    write = '{"path": "b.txt", "content": "x"}'
    dry = subprocess.run(
        [str(BIN / "toolctl"), "call", "write_file", "--args", write, "--dry-run", "--json"],
        capture_output=True,
        env=env,
        timeout=30,
    )
    result = json.loads(dry.stdout)
    assert result["data"]["dry_run"] is True and result["data"]["policy"] in ("allow", "ask", "deny")
    fetched = json.loads(
        subprocess.run(
            [str(BIN / "toolctl"), "call", "read_file", "--args", '{"path": "a.txt"}', "--json"],
            capture_output=True,
            env=env,
            timeout=30,
        ).stdout
    )
    assert fetched["data"]["path"] == "a.txt" and fetched["data"]["size"] == 6


def test_a_closed_pipe_ends_toolctl_quietly(daemon: DaemonProcess) -> None:
    env = {**os.environ, "TOOLD_ENDPOINT": daemon.endpoint}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before toolctl writes, as with `| head` done early
    proc = subprocess.run(
        [str(BIN / "toolctl"), "tools"], stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=30
    )
    os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr


def test_versions_and_lowercase_log_levels(tmp_path: Path) -> None:
    for program in ("toolctl", "toold"):
        shown = subprocess.run([str(BIN / program), "--version"], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and shown.stdout.startswith(f"{program} 0."), shown
    config = tmp_path / "c.toml"
    config.write_text("")
    checked = subprocess.run(
        [str(BIN / "toold"), "check-config", str(config), "--log-level", "debug"], capture_output=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr


def test_completion_scripts_and_completions_come_from_the_parsers(tmp_path: Path) -> None:
    for program in ("toolctl", "toold"):
        for shell in ("bash", "zsh", "fish"):
            script = subprocess.run(
                [str(BIN / program), "completion", shell], capture_output=True, text=True, timeout=30
            )
            assert script.returncode == 0 and program in script.stdout and len(script.stdout) > 200, (program, shell)
    # What the bash script asks of toolctl at a <TAB>: the subcommands starting with "jo"
    out = tmp_path / "completions"
    line = "toolctl jo"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run([str(BIN / "toolctl")], env=env, capture_output=True, timeout=30)
    assert out.read_text().split() == ["journal"]
