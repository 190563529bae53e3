"""`toolctl mcp` against the MCP SDK's 2.x client, for both lines of the bridge.

The 2.x client runs in .venv-mcp2 (made by scripts/bootstrap --dev) as a script of
its own. Its default mode probes for the 2026-07-28 protocol: against the bridge served
with the 2.x line that era is spoken, where an approval arrives as an ``input_required``
result and the client calls again with the person's answer; against the 1.x bridge it
falls back to the ``initialize`` handshake. ``legacy`` forces the handshake everywhere.
(test_mcp_bridge.py drives both bridges with the 1.x client.)
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, DaemonProcess, module_daemon
from tests.e2e.test_isolation import alive_with

REPO = Path(__file__).resolve().parents[2]
MCP2_PYTHON = REPO / ".venv-mcp2" / "bin" / "python"
BRIDGES = {"bridge on mcp 1.x": BIN / "toolctl", "bridge on mcp 2.x": REPO / ".venv-mcp2" / "bin" / "toolctl"}
CONFIG = """
[tools.approval]
timeout_seconds = 20
"""

#: The 2.x client's side: one scenario per run, its findings as one JSON line.
CLIENT = r"""
import json, sys
import anyio
from mcp import Client, StdioServerParameters, types

toolctl, endpoint, mode, scenario = sys.argv[1:5]
answers = []

async def elicit(ctx, params):
    answers.append(params.message)
    action = "decline" if scenario == "decline" else "accept"
    return types.ElicitResult(action=action, content={"remember_for_session": False} if action == "accept" else None)

async def main():
    server = StdioServerParameters(command=toolctl, args=["--endpoint", endpoint, "mcp"])
    async with Client(server, elicitation_callback=elicit, mode=mode) as client:
        report = {"protocol": client.session.protocol_version}
        if scenario == "basic":
            tools = await client.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            report["read_file_output_schema"] = next(t for t in tools.tools if t.name == "read_file").output_schema
            read = await client.call_tool("read_file", {"path": "hello.txt"})
            report["read"] = [read.is_error, read.content[0].text, read.structured_content]
        if scenario in ("basic", "decline"):
            shell = await client.call_tool("shell", {"command": "echo ran-after-approval"})
            report["shell"] = [shell.is_error, shell.content[0].text]
        if scenario == "progress":
            seen = []
            async def on_progress(progress, total, message):
                seen.append(message)
            await client.call_tool("shell", {"command": "echo one; sleep 0.3; echo two"}, progress_callback=on_progress)
            report["progress"] = seen
        if scenario == "by_hand":
            first = await client.session.call_tool("shell", {"command": "echo by-hand"}, allow_input_required=True)
            report["first"] = first.result_type
            if first.result_type == "input_required":
                (key, request), = first.input_requests.items()
                report["asks"] = request.params.message
                again = await client.session.call_tool(
                    "shell", {"command": "echo by-hand"}, allow_input_required=True,
                    input_responses={key: types.ElicitResult(action="accept", content={})},
                    request_state=first.request_state,
                )
                report["second"] = [again.is_error, again.content[0].text]
                stale = await client.session.call_tool(
                    "shell", {"command": "echo by-hand"}, allow_input_required=True,
                    input_responses={key: types.ElicitResult(action="accept", content={})},
                    request_state=first.request_state,
                )
                report["replayed"] = [stale.is_error, stale.content[0].text]
        if scenario.startswith("cancel "):
            marker = scenario.split()[1]

            def running():
                import os, pathlib
                found = []
                for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
                    try:
                        if marker.encode() in cmdline.read_bytes() and cmdline.parent.name != str(os.getpid()):
                            found.append(cmdline.parent.name)
                    except OSError:
                        pass
                return found

            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "shell", {"command": "sleep " + marker})
                with anyio.fail_after(30):  # approved by elicitation, then started
                    while not running():
                        await anyio.sleep(0.05)
                group.cancel_scope.cancel()  # cancels the request while its command runs
            report["cancelled"] = True
            with anyio.move_on_after(5):  # the session stays open: only the cancel can end it
                while running():
                    await anyio.sleep(0.05)
            report["still_running"] = running()
        report["asked"] = answers
        print(json.dumps(report))

anyio.run(main)
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    if not MCP2_PYTHON.exists():
        pytest.skip(f"{MCP2_PYTHON} is missing (scripts/bootstrap --dev makes it)")
    with module_daemon(tmp_path_factory, "mcp-lines", CONFIG) as d:
        (d.root / "hello.txt").write_text("hello from both lines\n")
        yield d


def drive(daemon: DaemonProcess, tmp_path: Path, bridge: str, mode: str, scenario: str) -> dict[str, Any]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    done = subprocess.run(
        [str(MCP2_PYTHON), str(script), str(BRIDGES[bridge]), daemon.endpoint, mode, scenario],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("bridge", list(BRIDGES))
def test_tools_results_and_an_approval_through_the_2x_client(
    daemon: DaemonProcess, tmp_path: Path, bridge: str, mode: str
) -> None:
    report = drive(daemon, tmp_path, bridge, mode, "basic")
    modern = bridge.endswith("2.x") and mode == "auto"
    assert report["protocol"] == ("2026-07-28" if modern else "2025-11-25"), report["protocol"]
    assert {"read_file", "shell", "apply_patch"} <= set(report["tools"])
    assert report["read_file_output_schema"]["type"] == "object"
    is_error, text, structured = report["read"]
    assert not is_error and text == "hello from both lines\n" and structured["path"] == "hello.txt"
    assert report["shell"][0] is False and report["shell"][1].startswith("ran-after-approval\n")
    assert "approved through MCP elicitation" in report["shell"][1]
    (asked,) = report["asked"]
    assert "echo ran-after-approval" in asked


@pytest.mark.parametrize("bridge", list(BRIDGES))
def test_a_declined_approval_denies_the_call(daemon: DaemonProcess, tmp_path: Path, bridge: str) -> None:
    report = drive(daemon, tmp_path, bridge, "auto", "decline")
    is_error, text = report["shell"]
    assert is_error and "declined through MCP elicitation" in text and "ran-after-approval" not in text


@pytest.mark.parametrize("bridge", list(BRIDGES))
def test_output_arrives_as_progress(daemon: DaemonProcess, tmp_path: Path, bridge: str) -> None:
    assert drive(daemon, tmp_path, bridge, "auto", "progress")["progress"] == ["one\n", "two\n"]


def test_the_2026_era_asks_with_input_required_and_a_state_that_works_once(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Driven by hand: the first leg ends ``input_required`` with the elicitation, the
    retry with the answer runs the command, and the same state again is refused."""
    report = drive(daemon, tmp_path, "bridge on mcp 2.x", "auto", "by_hand")
    assert report["first"] == "input_required"
    assert "echo by-hand" in report["asks"]
    assert report["second"][0] is False and report["second"][1].startswith("by-hand\n")
    assert report["replayed"][0] is True and "unknown or expired request_state" in report["replayed"][1]


def test_a_cancelled_call_of_the_2026_era_cancels_its_batch_and_kills_the_command(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """The approved command runs in a leg of its own; the client giving up on that leg
    cancels the batch waiting behind it, as a cancelled request does in the handshake era."""
    marker = f"38{uuid.uuid4().int % 10**6:06d}"
    report = drive(daemon, tmp_path, "bridge on mcp 2.x", "auto", f"cancel {marker}")
    assert report["cancelled"] and report["protocol"] == "2026-07-28"
    assert report["still_running"] == [], report  # seen while the client was still connected
    deadline = time.monotonic() + 5
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive_with(marker) == []
    with daemon.client() as client:
        latest = client.get_batch(client.list_batches(limit=1)[0].batch_id)
    assert latest.state == "cancelled", latest
