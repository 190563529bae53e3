"""``toolctl watch`` for real, in tmux: it shows the request, takes a key, shows the result."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import toold_protocol as p
from tests.conftest import BIN, DaemonProcess, start_daemon
from tests.e2e.test_daemon import submit_raw
from toold_client.watch import WatchState

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/bootstrap --dev)")


def pane(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=False
    ).stdout


def wait_for(session: str, condition: Callable[[str], bool], timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = pane(session)
        if condition(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"pane never matched; last capture:\n{text}")
        time.sleep(0.1)


def test_watch_shows_approves_and_follows_a_batch(daemon: DaemonProcess) -> None:
    session = f"toold-watch-{uuid.uuid4().hex[:8]}"
    command = f"env TOOLD_ENDPOINT={daemon.endpoint} {BIN / 'toolctl'} watch"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", command], check=True)
    try:
        wait_for(session, lambda t: "toold watch" in t)
        with daemon.client() as agent:
            args = {"command": "echo line-one; echo line-two; sleep 1.5; echo finished"}
            call = p.ToolCall(call_id="sh", name="shell", arguments=msgspec.Raw(p.encode_value(args)))
            accepted = submit_raw(agent, [call])
            shown = wait_for(session, lambda t: "APPROVAL" in t)
            assert "[high]" in shown and "Run: echo line-one" in shown
            subprocess.run(["tmux", "send-keys", "-t", session, "a"], check=True)
            running = wait_for(session, lambda t: "│ line-two" in t)
            assert "APPROVAL" not in running
            finished = agent.wait_batch(accepted.batch_id, timeout=30)
            assert finished.results[0].ok
        done = wait_for(session, lambda t: "✓ sh shell" in t and "[finished]" in t)
        assert "batch " + accepted.batch_id in done
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 10
        while subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "watch did not quit on q"
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)


def test_watch_screen_neutralizes_control_sequences() -> None:
    state = WatchState()
    evil = "\x1b]0;pwned\x07\x1b[2J"
    state.apply(
        p.BatchStatus(
            id=0,
            batch_id="b" + evil,
            state="running",
            calls=[p.PlannedCall(index=0, call_id="c", name="shell", disposition="run", summary="Run: " + evil)],
            results=[],
        )
    )
    state.apply(p.OutputChunk(batch_id="b" + evil, call_id="c", stream="stdout", data=evil + "\n", seq=0))
    state.apply(p.CallStarted(batch_id="b" + evil, call_id="c", index=0, name="shell"))
    screen = "\n".join(state.render(120, 40))
    assert "\x1b]" not in screen and "\x1b[2J" not in screen and "\x07" not in screen


def test_the_approver_can_scroll_back_through_a_running_calls_output() -> None:
    """At least 1,000 lines are kept, 50 shown; new output scrolls the view unless the
    person has scrolled up, and G follows again."""
    from toold_client.watch import OUTPUT_SHOWN

    state = WatchState()
    planned = p.PlannedCall(index=0, call_id="c", name="shell", disposition="run", summary="Run: seq")
    state.apply(p.BatchStatus(id=0, batch_id="b", state="running", calls=[planned], results=[]))
    state.apply(p.CallStarted(batch_id="b", call_id="c", index=0, name="shell"))
    state.apply(
        p.OutputChunk(batch_id="b", call_id="c", stream="stdout", data="".join(f"L{i}\n" for i in range(1500)), seq=0)
    )

    def shown() -> list[str]:
        return [line for line in state.render(200, 200) if "│" in line]

    assert len(shown()) == OUTPUT_SHOWN and shown()[-1].endswith("L1499\x1b[0m")
    state.scroll(10_000)  # as far back as kept: 1,000 lines
    assert shown()[0].endswith("L500\x1b[0m")
    state.apply(p.OutputChunk(batch_id="b", call_id="c", stream="stdout", data="new\n", seq=1))
    assert shown()[0].endswith("L501\x1b[0m")  # the oldest line fell out of the 1,000 kept; the view held still
    state.scroll(-10_000)
    assert shown()[-1].endswith("new\x1b[0m")


def test_the_approver_sees_which_parse_only_calls_wait_and_how_to_answer(tmp_path: Path) -> None:
    """A real parse-only daemon: the watcher learns of the batch and shows, for each call
    waiting for a person's result, the exact command that supplies it."""
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config='[tools]\nmode = "parse_only"\n')
    state = WatchState()
    try:
        with d.client() as watcher, d.client() as agent:
            watcher.watch()
            read = p.ToolCall(call_id="c0", name="read_file", arguments=msgspec.Raw(p.encode_value({"path": "a"})))
            unknown = p.ToolCall(call_id="c1", name="nope", arguments=msgspec.Raw(p.encode_value({})))
            accepted = submit_raw(agent, [read, unknown], batch_id="parsed")
            deadline = time.monotonic() + 10
            while accepted.batch_id not in state.batches and time.monotonic() < deadline:
                message = watcher.next_event(timeout=0.5)
                if message is not None:
                    state.apply(message)
            screen = "\n".join(state.render(200, 50))
            assert f"toolctl result c0 --batch {accepted.batch_id} --content TEXT" in screen, screen
            assert "toolctl result c1" not in screen
            agent.supply_result(accepted.batch_id, "c0", "done")
            while state.batches[accepted.batch_id].state != "finished" and time.monotonic() < deadline:
                message = watcher.next_event(timeout=0.5)
                if message is not None:
                    state.apply(message)
            assert "toolctl result c0" not in "\n".join(state.render(200, 50))
    finally:
        d.stop()


def test_watch_scrolls_back_through_a_calls_output_for_real(daemon: DaemonProcess) -> None:
    session = f"toold-watch-{uuid.uuid4().hex[:8]}"
    command = f"env TOOLD_ENDPOINT={daemon.endpoint} {BIN / 'toolctl'} watch"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "70", command], check=True)
    try:
        wait_for(session, lambda t: "toold watch" in t)
        with daemon.client() as agent:
            args = {"command": "seq 1 1500"}
            call = p.ToolCall(call_id="sq", name="shell", arguments=msgspec.Raw(p.encode_value(args)))
            accepted = submit_raw(agent, [call])
            wait_for(session, lambda t: "APPROVAL" in t)
            subprocess.run(["tmux", "send-keys", "-t", session, "a"], check=True)
            agent.wait_batch(accepted.batch_id, timeout=30)
        following = wait_for(session, lambda t: "│ 1500" in t)
        assert "following" in following and "│ 1450\n" not in following + "\n"
        subprocess.run(["tmux", "send-keys", "-t", session, "k", "k", "k"], check=True)  # 30 lines back
        back = wait_for(session, lambda t: "30 lines back" in t)
        assert "│ 1470" in back and "│ 1471" not in back and "│ 1500" not in back
        subprocess.run(["tmux", "send-keys", "-t", session, "G"], check=True)
        wait_for(session, lambda t: "│ 1500" in t and "following" in t)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)


def test_the_approver_sees_a_commands_connections_when_it_finishes() -> None:
    """The egress proxy's records of a call (``data.network``) are listed under it, and a
    host name carrying escape sequences is neutralised like everything else."""
    state = WatchState()
    planned = p.PlannedCall(index=0, call_id="c", name="shell", disposition="run", summary="Run: curl")
    state.apply(p.BatchStatus(id=0, batch_id="b", state="running", calls=[planned], results=[]))
    network = [
        {"host": "pypi.org", "port": 443, "protocol": "connect", "allowed_by": "pypi.org is in allowed_domains",
         "refused": "", "sent": 900, "received": 21000},
        {"host": "evil\x1b[2J.example", "port": 80, "protocol": "http", "refused": "denied by uid 1000"},
    ]  # fmt: skip
    result = p.ToolResult(call_id="c", ok=True, content="", data={"network": network})
    state.apply(p.CallFinished(batch_id="b", index=0, result=result))
    screen = "\n".join(state.render(200, 40))
    assert "-> pypi.org:443 (connect) allowed: pypi.org is in allowed_domains; sent 900 B, received 21000 B" in screen
    assert "refused: denied by uid 1000" in screen and "\x1b[2J" not in screen


def test_a_watcher_that_starts_late_sees_the_batches_already_waiting(tmp_path: Path) -> None:
    """Parse-only: the batch waits for a person's result before the watcher connects."""
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config='[tools]\nmode = "parse_only"\n')
    state = WatchState()
    try:
        with d.client() as agent:
            read = p.ToolCall(call_id="c0", name="read_file", arguments=msgspec.Raw(p.encode_value({"path": "a"})))
            accepted = submit_raw(agent, [read], batch_id="early")
            with d.client() as watcher:
                watcher.watch()
                deadline = time.monotonic() + 10
                while accepted.batch_id not in state.batches and time.monotonic() < deadline:
                    message = watcher.next_event(timeout=0.5)
                    if message is not None:
                        state.apply(message)
            screen = "\n".join(state.render(200, 50))
            assert f"toolctl result c0 --batch {accepted.batch_id} --content TEXT" in screen, screen
            agent.supply_result(accepted.batch_id, "c0", "done")
    finally:
        d.stop()


def test_the_approver_sees_mcp_servers_connections_from_the_journal(daemon: DaemonProcess, tmp_path: Path) -> None:
    """A server's connections belong to no batch: watch looks them up in the journal (a row
    written there as the daemon's egress bookkeeping writes it), escapes neutralised."""
    import sqlite3

    from toold_daemon.records import server_connections

    journal = sqlite3.connect(tmp_path / "state" / "journal.sqlite3", isolation_level=None)
    record = {"host": "files\x1b[2J.example", "port": 443, "protocol": "connect", "allowed_by": "allowed_domains"}
    owner = p.Identity(uid=os.getuid(), gid=os.getgid(), pid=1)
    journal.execute(server_connections.INSERT, server_connections.row("mcp:fetcher", owner, {**record, "sent": 77}, 0))
    journal.close()
    session = f"toold-watch-{uuid.uuid4().hex[:8]}"
    command = f"env TOOLD_ENDPOINT={daemon.endpoint} {BIN / 'toolctl'} watch"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "30", command], check=True)
    try:
        shown = wait_for(session, lambda t: "MCP servers' connections" in t)
        assert f"mcp:fetcher (uid {os.getuid()}) -> files" in shown and ".example:443 (connect)" in shown
        assert "allowed: allowed_domains; sent 77 B" in shown
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
