"""Python plugins: a distribution built and installed into a temporary target directory
at test time, found through its ``toold.tools`` entry points by a real daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, DaemonProcess, open_socket_to_everyone, start_daemon
from tests.e2e.test_identity import OTHER_UID, as_other_user
from toold_client import APPROVE_ALL, Client

PLUGIN = '''
"""A plugin of two tools, and three entry points that must be skipped."""

import gc
import os
from typing import Annotated

from msgspec import Meta

from toold_daemon.plugins import Tool, ToolArgs, ToolContext, ToolError, ToolErrorType, ToolOutput


class ShoutArgs(ToolArgs, frozen=True):
    text: Annotated[str, Meta(max_length=1000, description="What to shout")]


class Shout(Tool[ShoutArgs]):
    name = "shout"
    description = "Say it louder"
    args_type = ShoutArgs

    def summary(self, args: ShoutArgs) -> str:
        return f"Shout {args.text[:50]}"

    def run(self, args: ShoutArgs, ctx: ToolContext) -> ToolOutput:
        if args.text == "fail":
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "NO_VOICE", "cannot shout that")
        data = {"uid": os.getuid(), "pid": os.getpid(), "collecting": gc.isenabled()}
        return ToolOutput(args.text.upper(), data=data)


class StampArgs(ToolArgs, frozen=True):
    path: Annotated[str, Meta(description="File to stamp")]


class Stamp(Tool[StampArgs]):
    name = "stamp"
    description = "Write 'stamped' into a file"
    args_type = StampArgs
    side_effecting = True
    risk = "medium"

    def paths(self, args: StampArgs) -> list[str]:
        return [args.path]

    def run(self, args: StampArgs, ctx: ToolContext) -> ToolOutput:
        ctx.resolve(args.path).write_text("stamped")
        return ToolOutput(f"stamped {args.path}", data={"pid": os.getpid()})


class Clash(Shout):
    name = "read_file"

class Cold(Shout):
    """Its warming fails: the spawner must serve on, and the tool still run."""
    name = "cold"

    def warm(self) -> None:
        raise RuntimeError("no heating here")


class Moody(Shout):
    """A bug in how it builds its command: its own calls fail, nothing else does."""
    name = "moody"

    def command(self, args, ctx):
        raise RuntimeError("bad mood")


not_a_tool = "just a string"
'''

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toold-shout"
version = "1.2.3"

[tool.setuptools]
py-modules = ["toold_shout"]

[project.entry-points."toold.tools"]
shout = "toold_shout:Shout"
stamp = "toold_shout:Stamp"
cold = "toold_shout:Cold"
moody = "toold_shout:Moody"
clash = "toold_shout:Clash"
broken = "toold_shout_missing:Nope"
notatool = "toold_shout:not_a_tool"
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin, built and installed with pip into a directory of its own."""
    source = tmp_path_factory.mktemp("plugin-src")
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "toold_shout.py").write_text(textwrap.dedent(PLUGIN))
    installed = tmp_path_factory.mktemp("plugin-target")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(installed), str(source)],
        check=True,
        timeout=300,
    )  # fmt: skip
    return installed


@pytest.fixture
def daemon(tmp_path: Path, root: Path, target: Path) -> Iterator[DaemonProcess]:
    d = start_daemon(tmp_path, root, "--log-level", "INFO", env={"PYTHONPATH": str(target)})
    try:
        yield d
    finally:
        d.stop()


def test_plugin_tools_are_offered_and_run_in_a_worker(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        names = [t.name for t in client.tools()]  # type: ignore[union-attr]
        assert "shout" in names and "stamp" in names
        openai = client.tools("openai")
        shout = next(t for t in openai if t["function"]["name"] == "shout")  # type: ignore[index]
        assert shout["function"]["parameters"]["properties"]["text"]["description"] == "What to shout"
        result = client.call("shout", {"text": "hello"})
        assert result.ok and result.content == "HELLO"
        assert result.data is not None and result.data["pid"] != daemon.proc.pid  # not in the daemon
        assert result.data["collecting"] is True  # toold starts with the collector off; the spawner turns it on
        bad = client.call("shout", {"text": 3})
        assert bad.error is not None and bad.error.type == "BadArgs"
        failed = client.call("shout", {"text": "fail"})
        assert failed.error is not None and failed.error.code == "NO_VOICE"
        assert client.explain("stamp", {"path": "x.txt"}).decision == "ask"  # side effects ask, like built-ins
        stamped = client.call("stamp", {"path": "x.txt"}, on_confirm=lambda r: APPROVE_ALL)
        assert stamped.ok and (daemon.root / "x.txt").read_text() == "stamped"
        outside = client.call("stamp", {"path": "../outside.txt"}, on_confirm=lambda r: APPROVE_ALL)
        assert outside.error is not None and outside.error.type == "SandboxViolation"
        journal = client.list_batches()
        assert any(b.batch_id for b in journal)


def test_broken_plugins_are_skipped_with_their_reason(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        names = [t.name for t in client.tools()]  # type: ignore[union-attr]
        assert names.count("read_file") == 1  # the clash did not replace the built-in
        assert client.call("read_file", {"path": "nothing"}).error is not None
    log = daemon.log.read_text()
    assert "plugin broken skipped: ModuleNotFoundError" in log
    assert "plugin clash skipped: ValueError: the name 'read_file' is already taken" in log
    assert "plugin notatool skipped: TypeError" in log
    assert "plugin shout: tool shout from toold-shout 1.2.3" in log


def test_a_plugin_whose_warming_fails_leaves_the_spawner_serving(daemon: DaemonProcess) -> None:
    """The spawner warms tools after start; a plugin's failure there is logged, and every
    tool, that plugin's included, still runs in children forked afterwards."""
    deadline = time.monotonic() + 10
    while "warming cold failed: RuntimeError: no heating here" not in daemon.log.read_text():
        assert time.monotonic() < deadline, daemon.log.read_text()
        time.sleep(0.05)
    with daemon.client() as client:
        assert client.call("cold", {"text": "brr"}).content == "BRR"
        assert client.call("shout", {"text": "still"}).content == "STILL"
        assert client.call("stamp", {"path": "y.txt"}, on_confirm=lambda r: APPROVE_ALL).ok


def test_a_plugin_that_fails_to_build_its_command_fails_its_own_calls_only(daemon: DaemonProcess) -> None:
    """The daemon asks a read-only tool for its command as soon as a call is planned (to
    hand a lone call to a worker early) and again when it runs: a plugin raising there
    fails that call with why, never the submission, other tools or the daemon's stop."""
    with daemon.client() as client:
        for _ in range(3):
            result = client.call("moody", {"text": "hm"})
            assert not result.ok and result.error is not None and "bad mood" in result.content
        assert client.call("shout", {"text": "fine"}).content == "FINE"
    assert "could not be begun early" in daemon.log.read_text()
    started = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - started < 5


def test_a_plugin_runs_as_the_requesting_user(tmp_path: Path, target: Path) -> None:
    with _plugin_daemon(tmp_path, target) as d:

        def act(client: Client) -> dict[str, Any]:
            result = client.call("shout", {"text": "who"})
            return {"ok": result.ok, "data": result.data}

        seen = as_other_user(d.endpoint, act)
    assert seen["ok"] and seen["data"]["uid"] == OTHER_UID, seen


@contextmanager
def _plugin_daemon(tmp_path: Path, target: Path) -> Iterator[DaemonProcess]:
    """A daemon another uid can reach, with the plugin on its path."""
    shared = Path(tempfile.mkdtemp(prefix="toold-shared-"))
    os.chmod(shared, 0o711)
    workspace = shared / "workspace"
    workspace.mkdir(mode=0o755)
    d = start_daemon(tmp_path, workspace, socket_dir=shared / "run", env={"PYTHONPATH": str(target)})
    try:
        open_socket_to_everyone(d)
        yield d
    finally:
        d.stop()
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.parametrize(
    ("daemon_section", "expected"),
    [('disabled_plugins = ["shout"]', {"stamp"}), ('plugins = ["shout"]', {"shout"})],
)
def test_the_administrator_chooses_which_plugins_load(
    tmp_path: Path, root: Path, target: Path, daemon_section: str, expected: set[str]
) -> None:
    d = start_daemon(tmp_path, root, config=f"[daemon]\n{daemon_section}\n", env={"PYTHONPATH": str(target)})
    try:
        with d.client() as client:
            names = {t.name for t in client.tools()}  # type: ignore[union-attr]
        assert names & {"shout", "stamp"} == expected
    finally:
        d.stop()


def test_doctor_lists_the_plugins(target: Path) -> None:
    doctor = subprocess.run(
        [str(BIN / "toold"), "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    lines = [line for line in doctor.stdout.splitlines() if line.startswith("plugin ")]
    assert "plugin shout: tool shout from toold-shout 1.2.3" in lines
    assert any(line.startswith("plugin broken: skipped (ModuleNotFoundError") for line in lines), lines
    assert json.dumps(lines)  # printable
