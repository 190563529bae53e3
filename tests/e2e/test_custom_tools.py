"""Tools from the configuration: command tools run like shell, with schema-checked
arguments placed into argv (no shell); definitions in parse-only mode; bad entries refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, DaemonProcess, module_daemon, start_daemon
from toold_client import APPROVE_ALL

COMMANDS = """
[[tools.commands]]
name = "word_count"
description = "Count the words of a file"
argv = ["wc", "-w", "{file}"]
risk = "low"
side_effecting = false
parameters.type = "object"
parameters.properties.file.type = "string"
parameters.required = ["file"]
parameters.additionalProperties = false

[[tools.commands]]
name = "greet"
description = "Print a greeting"
argv = ["echo", "hello,", "{name}", "--times={times}"]
parameters.type = "object"
parameters.properties.name.type = "string"
parameters.properties.times = { type = "integer", minimum = 1 }
parameters.required = ["name"]
timeout_seconds = 5

[[tools.commands]]
name = "nap"
description = "Sleep"
argv = ["sleep", "{seconds}"]
timeout_seconds = 1
risk = "low"
side_effecting = false
parameters = { type = "object", properties = { seconds = { type = "string" } } }

[[tools.commands]]
name = "show_env"
description = "The environment"
argv = ["env"]
risk = "low"
side_effecting = false
env = { GREETING = "hi", API_TOKEN = "leaked?", LD_PRELOAD = "/tmp/x.so" }
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "commands", COMMANDS) as d:
        (d.root / "words.txt").write_text("one two three\n")
        yield d


def test_a_command_tool_runs_with_its_argument_as_one_argv_word(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        result = client.call("word_count", {"file": "words.txt"})
        assert result.ok, result.content
        assert result.content.split()[0] == "3"
        definitions = {d.name: d for d in client.tools()}  # type: ignore[union-attr]
        assert definitions["word_count"].parameters["required"] == ["file"]
        assert definitions["greet"].risk == "high" and definitions["greet"].side_effecting


def test_injection_attempts_are_just_text(daemon: DaemonProcess) -> None:
    attempts = ["words.txt; touch pwned", "$(touch pwned)", "`touch pwned`", "words.txt\ntouch pwned", "| touch pwned"]
    with daemon.client() as client:
        for attempt in attempts:
            result = client.call("word_count", {"file": attempt})
            assert not result.ok, attempt  # wc finds no file of that name
            assert "No such file" in result.content
        option = client.call("word_count", {"file": "--files0-from=/etc/passwd"})
        assert option.error is not None and option.error.type == "BadArgs" and "option" in option.error.message
    assert not (daemon.root / "pwned").exists()


def test_arguments_are_checked_against_the_schema(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        for arguments, field in (({}, "'file' is a required property"), ({"file": 3}, "file: 3 is not of type"),
                                 ({"file": "a", "extra": 1}, "Additional properties")):  # fmt: skip
            result = client.call("word_count", arguments)
            assert result.error is not None and result.error.type == "BadArgs", arguments
            assert field in result.error.message, result.error.message
        assert client.call("greet", {"name": "x", "times": 0}).error is not None


def test_a_command_tool_goes_through_policy_confirmation_and_timeout(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert client.explain("greet", {"name": "you"}).decision == "ask"  # high risk, side effects
        asked = []
        result = client.call(
            "greet", {"name": "you; rm -rf /", "times": 2}, on_confirm=lambda r: asked.append(r) or APPROVE_ALL
        )
        assert result.ok and result.content == "hello, you; rm -rf / --times=2\n[exit code 0]"
        assert asked and asked[0].calls[0].summary == "echo hello, 'you; rm -rf /' --times=2"
        slow = client.call("nap", {"seconds": "30"})
        assert slow.error is not None and slow.error.type == "Timeout"


def test_entry_env_passes_but_secrets_and_hooks_do_not(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        result = client.call("show_env", {})
    assert "GREETING=hi" in result.content
    assert "API_TOKEN" not in result.content and "LD_PRELOAD" not in result.content


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ('name = "read_file"\ndescription = "x"\nargv = ["true"]', "already taken"),
        ('name = "ls"\ndescription = "x"\nargv = ["true"]', "already taken"),  # an alias
        ('name = "t"\ndescription = "x"\nargv = ["cat", "{path}"]', "argv names {path}"),
        ('name = "t"\ndescription = "x"\nargv = ["true"]\nparameters = { type = "array" }', "object schema"),
        ('name = "t"\ndescription = "x"\nargv = ["true"]\nparameters = { type = "object", properties.a.type = 5 }',
         "not a valid JSON Schema"),
    ],
)  # fmt: skip
def test_bad_entries_are_refused_with_file_and_line(tmp_path: Path, entry: str, complaint: str) -> None:
    config = tmp_path / "toold.toml"
    config.write_text(f'[tools]\nmode = "enabled"\n\n[[tools.commands]]\n{entry}\n')
    checked = subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode != 0
    assert f"{config}:4:" in checked.stderr and complaint in checked.stderr, checked.stderr
    started = subprocess.run(
        [str(BIN / "toold"), "serve", "--config", str(config), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode != 0 and complaint in started.stderr


def test_two_entries_with_one_name_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "toold.toml"
    entry = '[[tools.commands]]\nname = "twice"\ndescription = "x"\nargv = ["true"]\n'
    config.write_text(entry + "\n" + entry.replace("commands", "definitions").replace('argv = ["true"]\n', ""))
    checked = subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)
    assert checked.returncode != 0 and f"{config}:6:" in checked.stderr and "already taken" in checked.stderr


DEFINITIONS = """
[tools]
mode = "{mode}"

[[tools.definitions]]
name = "deploy"
description = "Deploy the service (a person does it)"
parameters.type = "object"
parameters.properties.env = {{ type = "string", enum = ["staging", "prod"] }}
parameters.required = ["env"]
"""


def test_definitions_are_advertised_and_recorded_in_parse_only_mode(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config=DEFINITIONS.format(mode="parse_only"))
    try:
        with d.client() as client:
            tools = {t.name: t for t in client.tools()}  # type: ignore[union-attr]
            assert tools["deploy"].parameters["properties"]["env"]["enum"] == ["staging", "prod"]
            bad = client.submit([{"id": "1", "name": "deploy", "arguments": {"env": "moon"}}], events="results")
            assert bad.results[0].error is not None and bad.results[0].error.type == "BadArgs"
            outcome_box: list[object] = []

            def supply(event: object) -> None:
                if getattr(event, "calls", None) and not outcome_box:
                    outcome_box.append(event)

            import threading

            def answer() -> None:
                import time

                with d.client() as person:
                    for _ in range(200):
                        pending = [b for b in person.list_batches() if b.state != "finished"]
                        if pending:
                            person.supply_result(pending[0].batch_id, "c1", "deployed to staging")
                            return
                        time.sleep(0.05)

            helper = threading.Thread(target=answer)
            helper.start()
            outcome = client.submit([{"id": "c1", "name": "deploy", "arguments": {"env": "staging"}}], timeout=30)
            helper.join()
            assert outcome.results[0].ok and outcome.results[0].content == "deployed to staging"
    finally:
        d.stop()


def test_definitions_are_not_advertised_in_enabled_mode(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config=DEFINITIONS.format(mode="enabled"))
    try:
        with d.client() as client:
            assert "deploy" not in [t.name for t in client.tools()]  # type: ignore[union-attr]
            result = client.call("deploy", {"env": "prod"})
            assert result.error is not None and result.error.type == "UnknownTool"
    finally:
        d.stop()
