"""toold as an MCP gateway: third-party stdio MCP servers (the reference filesystem and
everything servers from npm, and a hostile one of ours) behind the daemon's policy,
journal and confinement."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, DaemonProcess, module_daemon, reachable_daemon, start_daemon
from tests.e2e.test_identity import OTHER_UID, as_other_user
from tests.mcp_peers import PREFIX, REPO, npm_bin
from toold_client import CallSpec, Client, Decision

HOSTILE = REPO / "tests" / "mcp_servers" / "hostile.py"
# The system's interpreter (stdlib is all the hostile server needs): another user cannot
# execute ours when it lives in root's home.
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def hostile_entry(name: str, *args: str) -> str:
    """A ``[[mcp.servers]]`` entry running the hostile server with ``args``."""
    quoted = ", ".join(f'"{a}"' for a in (str(HOSTILE), *args))
    lines = [f'name = "{name}"', f'command = "{PYTHON}"', f"args = [{quoted}]", f'read_paths = ["{HOSTILE.parent}"]']
    return "[[mcp.servers]]\n" + "\n".join(lines) + "\n"


def servers_config(*, idle_seconds: float = 600, extra: str = "") -> str:
    npm_bin("mcp-server-filesystem")  # installs the pinned servers (or skips without npm)
    modules = PREFIX / "node_modules" / "@modelcontextprotocol"
    return f"""
[tools.approval]
mode = "auto"

[[tools.approval.rules]]
tool = "mcp__fs__move_file"
decision = "deny"
message = "moves are not for agents"

[[tools.approval.rules]]
tool = "mcp__everything__echo"
decision = "ask"

[mcp]
idle_seconds = {idle_seconds}

[[mcp.servers]]
name = "fs"
command = "node"
args = ["{modules}/server-filesystem/dist/index.js", "{{workspace}}"]
read_paths = ["{PREFIX}"]

[[mcp.servers]]
name = "everything"
command = "node"
args = ["{modules}/server-everything/dist/index.js", "stdio"]
read_paths = ["{PREFIX}"]

{hostile_entry("hostile")}
{extra}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    secret_env = {"AWS_SECRET_ACCESS_KEY": "do-not-leak", "GITHUB_TOKEN": "ghp_do_not_leak"}
    with module_daemon(tmp_path_factory, "mcp-gateway", servers_config(), env=secret_env) as d:
        yield d


def call(daemon: DaemonProcess, name: str, args: dict[str, Any], **kwargs: Any) -> Any:
    with daemon.client(timeout=60) as c:
        return c.call(name, args, **kwargs)


def test_their_tools_join_the_registry_with_their_schemas(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=60) as c:
        tools = {t.name: t for t in c.tools()}
    assert {"mcp__fs__read_text_file", "mcp__fs__write_file", "mcp__everything__get-sum"} <= set(tools)
    assert tools["mcp__everything__get-sum"].parameters["properties"].keys() >= {"a", "b"}
    assert tools["mcp__fs__write_file"].side_effecting  # the server's hints are not trusted by default
    assert "read_file" in tools  # the built-ins are still there
    # What a server lists is checked: a bad name and a tool without a schema are refused.
    assert "mcp__hostile__whoami" in tools
    assert not any("bad name" in n or n.endswith("no_schema") for n in tools)


def test_a_call_goes_through_policy_journal_and_the_workspace(daemon: DaemonProcess) -> None:
    target = daemon.root / "from-mcp.txt"
    written = call(daemon, "mcp__fs__write_file", {"path": str(target), "content": "über MCP\n"})
    assert written.ok, written
    assert target.read_text() == "über MCP\n"
    with daemon.client(timeout=60) as c:
        outcome = c.submit([CallSpec("mcp__fs__read_text_file", {"path": str(target)})], batch_id="mcp-read-1")
        assert outcome.results[0].ok and outcome.results[0].content == "über MCP\n"
        journaled = c.get_batch(outcome.batch_id)
        assert journaled.state == "finished" and journaled.results[0].content == "über MCP\n"
        again = c.submit([CallSpec("mcp__fs__read_text_file", {"path": str(target)})], batch_id="mcp-read-1")
        assert again.results[0].content == "über MCP\n"  # answered from the journal, exactly once


def test_arguments_are_checked_against_the_servers_schema(daemon: DaemonProcess) -> None:
    result = call(daemon, "mcp__everything__get-sum", {"a": "two", "b": 3})
    assert not result.ok and result.error is not None and result.error.type == "BadArgs"
    assert call(daemon, "mcp__everything__get-sum", {"a": 2, "b": 3}).content.endswith("5.")


def test_a_deny_rule_on_one_of_their_tools_holds(daemon: DaemonProcess) -> None:
    (daemon.root / "stay.txt").write_text("x")
    result = call(daemon, "mcp__fs__move_file", {"source": "stay.txt", "destination": "gone.txt"})
    assert not result.ok and result.error is not None and result.error.code == "DENIED_BY_POLICY"
    assert "moves are not for agents" in result.error.message
    assert (daemon.root / "stay.txt").exists() and not (daemon.root / "gone.txt").exists()


def test_an_ask_rule_asks_a_person_first(daemon: DaemonProcess) -> None:
    asked: list[str] = []

    def deny(request: Any) -> Decision:
        asked.append(request.calls[0].name)
        return Decision("deny_all")

    refused = call(daemon, "mcp__everything__echo", {"message": "hi"}, on_confirm=deny)
    assert asked == ["mcp__everything__echo"] and not refused.ok
    approved = call(
        daemon, "mcp__everything__echo", {"message": "hi"}, on_confirm=lambda request: Decision("approve_all")
    )
    assert approved.ok and "hi" in approved.content


def test_the_kernel_stops_a_server_writing_outside_the_workspace(daemon: DaemonProcess) -> None:
    outside = daemon.root.parent / "written-by-a-server.txt"
    result = call(daemon, "mcp__hostile__write", {"path": str(outside), "text": "escaped"})
    assert not result.ok and "Permission denied" in result.content
    assert not outside.exists()
    inside = call(daemon, "mcp__hostile__write", {"path": str(daemon.root / "inside.txt"), "text": "ok"})
    assert inside.ok and (daemon.root / "inside.txt").read_text() == "ok"


def test_a_server_runs_as_the_caller_with_a_scrubbed_environment(daemon: DaemonProcess) -> None:
    result = call(daemon, "mcp__hostile__whoami", {})
    assert result.ok and result.data is not None
    assert result.data["uid"] == os.getuid() and result.data["cwd"] == str(daemon.root)
    env = result.data["env"]
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env
    everything = call(daemon, "mcp__everything__get-env", {})
    assert everything.ok and "do-not-leak" not in everything.content and "ghp_do_not_leak" not in everything.content


def test_a_server_has_no_network_unless_its_entry_says_so(daemon: DaemonProcess) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        result = call(daemon, "mcp__hostile__connect", {"port": listener.getsockname()[1]})
    assert not result.ok and "connect failed" in result.content


def test_a_server_that_dies_or_sends_garbage_fails_that_call_and_is_restarted(daemon: DaemonProcess) -> None:
    before = call(daemon, "mcp__hostile__whoami", {}).data["pid"]
    crashed = call(daemon, "mcp__hostile__crash", {})
    assert not crashed.ok and crashed.error.code == "MCP_SERVER_FAILED"
    assert "crashing on purpose" in crashed.error.message  # its stderr is reported
    after = call(daemon, "mcp__hostile__whoami", {}).data["pid"]
    assert after != before and not _alive(before)
    garbage = call(daemon, "mcp__hostile__garbage", {})
    assert not garbage.ok and "not JSON" in garbage.error.message
    assert call(daemon, "mcp__hostile__whoami", {}).ok
    with daemon.client() as c:
        assert c.ping() >= 0  # the daemon kept serving


def test_a_cancelled_call_leaves_the_server_serving(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=30) as c:
        started = time.monotonic()
        result = c.call("mcp__hostile__sleep", {"seconds": 0.2})
        assert result.ok and time.monotonic() - started < 10


def test_a_server_that_cannot_start_is_reported_and_the_daemon_serves_on(tmp_path: Path) -> None:
    config = servers_config(
        extra=f"""
{hostile_entry("dies", "--start=die")}

{hostile_entry("garbled", "--start=garbage")}
start_timeout_seconds = 5
"""
    )
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=config)
    try:
        with d.client(timeout=60) as c:
            names = {t.name for t in c.tools()}
            assert "mcp__hostile__whoami" in names
            assert not any(n.startswith(("mcp__dies__", "mcp__garbled__")) for n in names)
            unknown = c.call("mcp__dies__anything", {})
            assert not unknown.ok
            assert c.call("read_file", {"path": "."}).error is not None  # still serving
        log = d.log.read_text()
        assert "refusing to start" in log and "not JSON" in log
    finally:
        d.stop()


def test_idle_servers_are_stopped_and_shutdown_stops_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=servers_config(idle_seconds=1))
    try:
        with d.client(timeout=60) as c:
            first = c.call("mcp__hostile__whoami", {}).data["pid"]
            deadline = time.monotonic() + 10
            while _alive(first) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(first), "an idle server was not stopped"
            second = c.call("mcp__hostile__whoami", {}).data["pid"]
            assert _alive(second)
    finally:
        d.stop()
    assert not _alive(second)


def test_each_user_gets_an_instance_of_their_own(tmp_path: Path) -> None:
    with reachable_daemon(tmp_path, config=servers_config()) as d:
        mine = Client(d.endpoint, timeout=60).call("mcp__hostile__whoami", {})

        def whoami(client: Client) -> dict[str, Any]:
            result = client.call("mcp__hostile__whoami", {})
            return {"ok": result.ok, "data": result.data, "content": result.content}

        theirs = as_other_user(d.endpoint, whoami)
        assert theirs.get("ok"), theirs
        assert mine.data is not None
        assert theirs["data"]["uid"] == OTHER_UID and mine.data["uid"] == os.getuid()
        assert theirs["data"]["pid"] != mine.data["pid"]


def test_doctor_starts_each_server_and_reports_the_one_that_fails(tmp_path: Path) -> None:
    config = tmp_path / "toold.toml"
    config.write_text(
        f"""
{hostile_entry("hostile")}

{hostile_entry("dies", "--start=die")}
"""
    )
    done = subprocess.run(
        [str(BIN / "toold"), "doctor", "--json", "--config", str(config), "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    report = json.loads(done.stdout)
    assert report["service"]["mcp hostile"]["on"] and report["service"]["mcp hostile"]["detail"].startswith("7 tools")
    failed = report["service"]["mcp dies"]
    assert not failed["on"] and failed["required"] and "refusing to start" in failed["detail"]
    assert done.returncode == 1 and "mcp dies" in report["required_off"]


def _alive(pid: int) -> bool:
    """Running, not a zombie. The process may be reaped between the two looks: gone then."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_a_server_with_network_reaches_only_allowed_hosts_through_the_proxy(tmp_path: Path) -> None:
    """``network = true`` for a server means the default mode, proxy: the rules decide
    each connection (a host they leave open is refused: no person is asked for a server),
    and a direct connection finds no network."""
    from tests.webserver import serving

    with serving("127.0.0.2") as allowed, serving("127.0.0.3") as other:
        config = f"""
[tools.approval]
mode = "auto"

[tools.network]
allowed_domains = ["127.0.0.2"]
allowed_networks = ["127.0.0.0/8"]
allowed_ports = [{allowed.port}, {other.port}]

{hostile_entry("net")}network = true
"""
        root = tmp_path / "root"
        root.mkdir()
        d = start_daemon(tmp_path, root, config=config)
        try:
            fetched = call(d, "mcp__net__run", {"argv": ["curl", "-sS", allowed.url("/json")]})
            refused = call(d, "mcp__net__run", {"argv": ["curl", "-sS", "-i", other.url("/json")]})
            direct = call(d, "mcp__net__connect", {"port": allowed.port})
            env = call(d, "mcp__net__whoami", {}).data["env"]
            kept = _server_connections(d, expected=2)
            shown = subprocess.run(
                [str(BIN / "toolctl"), "--endpoint", d.endpoint, "journal", "connections", "--server", "mcp:net"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            d.stop()
    assert '"toold"' in fetched.content, fetched.content
    assert "403" in refused.content and not other.requests
    assert not direct.ok and "connect failed" in direct.content
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1:") and env["ALL_PROXY"].startswith("socks5h://")
    # A server's connections belong to no one call: each is in the audit trail as it ends.
    records = [line for line in d.log.read_text().splitlines() if line.startswith("audit=connection")]
    reached = [r for r in records if f"host=127.0.0.2 port={allowed.port}" in r]
    turned_away = [r for r in records if f"host=127.0.0.3 port={other.port}" in r]
    assert len(reached) == 1 and "server=mcp:net" in reached[0] and "allowed_by=" in reached[0], records
    assert "received=0" not in reached[0], reached
    assert len(turned_away) == 1 and "reason=" in turned_away[0], records
    # ... and in the journal, newest first, for the server's uid (and root) to list.
    refused_row, reached_row = kept
    assert (refused_row.host, refused_row.port, refused_row.server) == ("127.0.0.3", other.port, "mcp:net")
    assert refused_row.refused and not refused_row.sent and refused_row.uid == os.getuid()
    assert (reached_row.host, reached_row.port) == ("127.0.0.2", allowed.port)
    assert reached_row.allowed_by and not reached_row.refused and reached_row.received > 0
    lines = shown.stdout.splitlines()
    assert shown.returncode == 0 and len(lines) == 2, shown
    assert f"mcp:net (uid {os.getuid()}) -> 127.0.0.3:{other.port}" in lines[0] and "refused:" in lines[0]
    assert f"-> 127.0.0.2:{allowed.port}" in lines[1] and "allowed:" in lines[1]


def _server_connections(daemon: DaemonProcess, *, expected: int) -> list[Any]:
    """The journal's connections of MCP servers, once ``expected`` are in (a connection's
    record comes when it ends, which may be after the call that made it returned)."""
    deadline = time.monotonic() + 10
    with daemon.client(timeout=60) as client:
        while True:
            rows = client.list_connections()
            if len(rows) >= expected or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)
