"""`toolctl mcp` driven by MCP clients nobody here wrote: the official SDK's ClientSession
over stdio, and the MCP Inspector's CLI. Every test runs twice: against the bridge served
with the SDK's 1.x line (this environment) and with its 2.x line (.venv-mcp2, made by
scripts/bootstrap --dev); test_mcp_sdk_lines.py adds the 2.x client."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError

from tests.conftest import BIN, DaemonProcess, module_daemon
from tests.e2e.test_isolation import alive_with
from tests.mcp_peers import npm_bin

CONFIG = """
[tools.approval]
allowlist = ["shell"]
timeout_seconds = 3
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "mcp-bridge", CONFIG) as d:
        (d.root / "hello.txt").write_text("hello over MCP\n")
        yield d


MCP2_TOOLCTL = Path(__file__).resolve().parents[2] / ".venv-mcp2" / "bin" / "toolctl"
_served_with = [BIN / "toolctl"]


@pytest.fixture(autouse=True, params=["served with mcp 1.x", "served with mcp 2.x"])
def served_with(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Which toolctl serves the bridge in this run of the test."""
    toolctl = BIN / "toolctl" if "1.x" in request.param else MCP2_TOOLCTL
    if not toolctl.exists():
        pytest.skip(f"{toolctl} is missing (scripts/bootstrap --dev makes it)")
    _served_with[0] = toolctl
    try:
        yield toolctl
    finally:
        _served_with[0] = BIN / "toolctl"


def bridge(daemon: DaemonProcess, *extra: str) -> StdioServerParameters:
    command = str(_served_with[0])
    return StdioServerParameters(command=command, args=["--endpoint", daemon.endpoint, "mcp", *extra])


def run_session(
    daemon: DaemonProcess,
    body: Callable[[ClientSession], Awaitable[Any]],
    *,
    elicit: Callable[[types.ElicitRequestParams], types.ElicitResult] | None = None,
    roots: list[Path] | None = None,
    extra: tuple[str, ...] = (),
) -> Any:
    """Launch the bridge as an MCP client would and run ``body`` in an initialized session."""

    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert elicit is not None
        return elicit(params)

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=f"file://{r}") for r in roots or []])  # type: ignore[arg-type]

    async def main() -> Any:
        async with (
            stdio_client(bridge(daemon, *extra)) as (read, write),
            ClientSession(
                read,
                write,
                elicitation_callback=elicitation if elicit is not None else None,
                list_roots_callback=list_roots if roots is not None else None,
            ) as session,
        ):
            await session.initialize()
            with anyio.fail_after(60):
                return await body(session)

    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:  # the SDK's task groups wrap what went wrong
        raise first_leaf(group) from None


def first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def test_tools_are_listed_with_schemas_and_hints(daemon: DaemonProcess) -> None:
    listed = run_session(daemon, lambda s: s.list_tools())
    tools = {tool.name: tool for tool in listed.tools}
    with daemon.client() as client:
        definitions = {d.name: d for d in client.tools()}
    assert set(tools) == set(definitions)
    read, write, delete = tools["read_file"], tools["write_file"], tools["delete_file"]
    assert read.inputSchema == definitions["read_file"].parameters
    assert read.annotations is not None and read.annotations.readOnlyHint is True
    assert read.annotations.destructiveHint is False
    assert write.annotations is not None and write.annotations.readOnlyHint is False
    assert delete.annotations is not None and delete.annotations.destructiveHint is True
    for name, tool in tools.items():  # every tool's data schema, as MCP's output schema
        assert tool.outputSchema == definitions[name].data_schema, name
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object", name


def test_call_returns_text_structured_data_and_is_error(daemon: DaemonProcess) -> None:
    async def body(session: ClientSession) -> tuple[types.CallToolResult, ...]:
        ok = await session.call_tool("read_file", {"path": "hello.txt"})
        missing = await session.call_tool("read_file", {"path": "missing.txt"})
        bad = await session.call_tool("read_file", {"path": 42})
        unknown = await session.call_tool("no_such_tool", {})
        return ok, missing, bad, unknown

    ok, missing, bad, unknown = run_session(daemon, body)
    assert not ok.isError and "hello over MCP" in text_of(ok)
    assert ok.structuredContent is not None and ok.structuredContent["path"] == "hello.txt"
    # the SDK itself checks structured content against the tool's outputSchema; checked here too
    with daemon.client() as client:
        schema = {d.name: d for d in client.tools()}["read_file"].data_schema
    assert Draft202012Validator(schema).is_valid(ok.structuredContent)
    assert missing.structuredContent is None  # an error carries no structured content
    assert missing.isError and "FileNotFound" in text_of(missing)
    assert bad.isError and "BadArgs" in text_of(bad)
    assert unknown.isError and "UnknownTool" in text_of(unknown)
    with daemon.client() as client:  # each call was a journaled batch of the daemon
        assert any(b.calls == 1 for b in client.list_batches(limit=5))


def test_elicitation_accept_approves_and_decline_denies(daemon: DaemonProcess) -> None:
    target = daemon.root / f"e-{uuid.uuid4().hex[:6]}.txt"
    target.write_text("before")
    asked: list[str] = []
    answers = iter(["accept", "decline"])

    def elicit(params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        assert "remember_for_workspace" not in params.requestedSchema["properties"]  # for network hosts only
        action = next(answers)
        return types.ElicitResult(action=action, content={} if action == "accept" else None)  # type: ignore[arg-type]

    async def body(session: ClientSession) -> tuple[types.CallToolResult, str, types.CallToolResult]:
        arguments = {"path": target.name, "content": "after", "overwrite": True}
        accepted = await session.call_tool("write_file", arguments)
        between = target.read_text()
        declined = await session.call_tool("write_file", arguments | {"content": "again"})
        return accepted, between, declined

    accepted, between, declined = run_session(daemon, body, elicit=elicit)
    assert len(asked) == 2 and target.name in asked[0] and "write_file" in asked[0]
    assert not accepted.isError and between == "after"
    assert "approved through MCP elicitation" in text_of(accepted)
    assert declined.isError and "declined through MCP elicitation" in text_of(declined)
    assert target.read_text() == "after"


def test_without_elicitation_an_approver_decides(daemon: DaemonProcess) -> None:
    target = daemon.root / f"a-{uuid.uuid4().hex[:6]}.txt"
    target.write_text("before")
    approved: list[str] = []

    def approver() -> None:
        with daemon.client() as client:
            client.subscribe()
            request = client.next_confirmation(timeout=20)
            if request is not None:
                approved.append(request.calls[0].name)
                from toold_client import APPROVE_ALL

                client.confirm(request.correlation_id, APPROVE_ALL)

    thread = threading.Thread(target=approver)
    thread.start()
    time.sleep(0.3)
    result = run_session(
        daemon, lambda s: s.call_tool("write_file", {"path": target.name, "content": "approved", "overwrite": True})
    )
    thread.join(10)
    assert approved == ["write_file"] and not result.isError and target.read_text() == "approved"
    assert "left to an approver" in text_of(result) and "approved]" in text_of(result)
    timed_out = run_session(
        daemon, lambda s: s.call_tool("write_file", {"path": target.name, "content": "late", "overwrite": True})
    )
    assert timed_out.isError and "nobody answered before the approval timeout" in text_of(timed_out)
    assert target.read_text() == "approved"


def test_output_streams_as_progress(daemon: DaemonProcess) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def body(session: ClientSession) -> types.CallToolResult:
        return await session.call_tool(
            "shell", {"command": "echo first; sleep 0.3; echo second"}, progress_callback=on_progress
        )

    result = run_session(daemon, body)
    assert not result.isError
    assert [m for _, m in progress] == ["first\n", "second\n"]
    assert progress[0][0] < progress[1][0]  # progress only grows


def test_cancelled_request_cancels_the_batch_and_kills_the_command(daemon: DaemonProcess) -> None:
    marker = f"37{uuid.uuid4().int % 10**6:06d}"
    outcome: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        async def call() -> None:
            try:
                outcome["result"] = await session.call_tool("shell", {"command": f"sleep {marker}"})
            except McpError as exc:
                outcome["error"] = exc.error.message

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(20):  # cancelled once its command runs
                while not alive_with(marker):
                    await anyio.sleep(0.05)
            request_id = session._request_id - 1  # the call's id: the session numbers requests in order
            cancel = types.CancelledNotification(params=types.CancelledNotificationParams(requestId=request_id))
            await session.send_notification(types.ClientNotification(cancel))
            await anyio.sleep(1.5)  # no reply comes to a cancelled request: none may come in this time
            group.cancel_scope.cancel()

    run_session(daemon, body)
    assert outcome == {}, outcome
    time.sleep(0.5)
    assert alive_with(marker) == []
    with daemon.client() as client:
        latest = client.get_batch(client.list_batches(limit=1)[0].batch_id)
    assert latest.state == "cancelled"
    assert latest.results[0].error is not None and latest.results[0].error.type == "Cancelled"


def test_roots_choose_the_workspace_and_the_flag_overrides(tmp_path: Path, daemon: DaemonProcess) -> None:
    project = Path(daemon.root) / f"project-{uuid.uuid4().hex[:6]}"
    project.mkdir()
    (project / "only-here.txt").write_text("in the project\n")

    def read(session: ClientSession) -> Awaitable[types.CallToolResult]:
        return session.call_tool("read_file", {"path": "only-here.txt"})

    from_roots = run_session(daemon, read, roots=[project])
    assert not from_roots.isError and "in the project" in text_of(from_roots)
    overridden = run_session(daemon, read, roots=[project], extra=("--workspace", str(daemon.root)))
    assert overridden.isError and "FileNotFound" in text_of(overridden)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    refused = run_session(daemon, read, roots=[outside])
    assert refused.isError  # a workspace the daemon refuses is an error, not the daemon's roots


def test_mcp_inspector_cli_lists_and_calls(daemon: DaemonProcess) -> None:
    inspector = npm_bin("mcp-inspector")
    base = [str(inspector), "--cli", str(_served_with[0]), "--endpoint", daemon.endpoint, "mcp"]
    listed = subprocess.run([*base, "--method", "tools/list"], capture_output=True, text=True, timeout=120, check=True)
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"read_file", "write_file", "shell"} <= names
    called = subprocess.run(
        [*base, "--method", "tools/call", "--tool-name", "read_file", "--tool-arg", "path=hello.txt"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    reply = json.loads(called.stdout)
    assert reply.get("isError") in (None, False) and "hello over MCP" in reply["content"][0]["text"]


def test_without_a_daemon_requests_fail_with_a_clear_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A JSON-RPC error that says why, and no crash report in the bridge's stderr (which
    MCP clients show in their logs)."""
    ghost = DaemonProcess(f"ipc://{tmp_path}/none.sock", tmp_path, tmp_path / "none.sock", None, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(McpError, match="no daemon socket") as raised:
        run_session(ghost, lambda s: s.list_tools())
    assert raised.value.error.code == types.INTERNAL_ERROR
    assert "Traceback" not in capfd.readouterr().err


def test_a_new_network_host_can_be_allowed_for_the_workspace_through_elicitation(tmp_path: Path) -> None:
    """A command's connection to a host neither allowed nor denied is asked through MCP
    elicitation, whose form then offers "always in this workspace"; chosen, a later
    session (a new bridge) reaches the host without being asked."""
    from tests.conftest import start_daemon
    from tests.webserver import serving

    with serving("127.0.0.3") as web:
        root = tmp_path / "root"
        root.mkdir()
        config = f"""
[tools.approval]
allowlist = ["shell"]
[tools.network]
allowed_networks = ["127.0.0.3/32"]
allowed_ports = [{web.port}]
ask_timeout_seconds = 20
"""
        d = start_daemon(tmp_path, root, config=config)
        asked: list[types.ElicitRequestParams] = []

        def elicit(params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params)
            return types.ElicitResult(action="accept", content={"remember_for_workspace": True})

        command = {"command": f"curl -sS {web.url('/json')}"}
        try:
            first = run_session(d, lambda s: s.call_tool("shell", command), elicit=elicit)
            second = run_session(d, lambda s: s.call_tool("shell", command), elicit=elicit)
        finally:
            d.stop()
    assert not first.isError and '"toold"' in text_of(first), text_of(first)
    assert "approved through MCP elicitation for this workspace" in text_of(first)
    assert len(asked) == 1, [p.message for p in asked]
    assert "remember_for_workspace" in asked[0].requestedSchema["properties"]
    assert f"127.0.0.3:{web.port}" in asked[0].message
    assert not second.isError and '"toold"' in text_of(second), text_of(second)


def test_json_rpc_details_the_sdk_would_get_wrong(daemon: DaemonProcess) -> None:
    """Spoken line by line over stdio: the server names itself toold with toolctl's
    version, an unknown method is -32601 (method not found), a cancelled request gets
    no reply while the session goes on answering, and the bridge exits once its stdin
    closes."""
    import importlib.metadata

    proc = subprocess.Popen(
        [str(_served_with[0]), "--endpoint", daemon.endpoint, "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        proc.stdin.flush()

    def until(request_id: int) -> list[dict[str, Any]]:
        seen = []
        while True:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, "the bridge closed stdout"
            seen.append(json.loads(line))
            if seen[-1].get("id") == request_id:
                return seen

    try:
        client = {"name": "t", "version": "1"}
        capabilities = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
        send({"id": 1, "method": "initialize", "params": capabilities})
        info = until(1)[-1]["result"]["serverInfo"]
        send({"method": "notifications/initialized"})
        send({"id": 2, "method": "no/such/method", "params": {}})
        unknown = until(2)[-1]
        send({"id": 3, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": "sleep 30"}}})
        time.sleep(1.0)
        send({"method": "notifications/cancelled", "params": {"requestId": 3, "reason": "changed my mind"}})
        time.sleep(1.5)
        send({"id": 4, "method": "ping"})
        later = until(4)
        proc.stdin.close()  # the client ends the session: the bridge exits on its own, at once
        closed_at = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        exited_after = time.monotonic() - closed_at
    finally:
        proc.kill()
        proc.wait()
    assert info == {"name": "toold", "version": importlib.metadata.version("toold-client")}
    assert unknown["error"]["code"] == -32601, unknown
    assert [m for m in later if m.get("id") == 3] == [], later  # no reply to the cancelled call
    assert later[-1].get("result") == {}
    # SDK clients wait a moment and then kill a server that stays; one that never kills it
    # would be left with a bridge running for good
    assert proc.returncode == 0 and exited_after < 1.5, (proc.returncode, exited_after)
