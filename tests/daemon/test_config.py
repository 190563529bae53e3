"""Configuration: defaults, the documented layout, errors with file and line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN
from toold_daemon.config import Config, ConfigError
from toold_daemon.config.loading import load_file, parse


def test_every_setting_has_a_default() -> None:
    config = parse("")
    assert config == Config()
    assert config.tools.max_tool_calls_per_batch == 8 and config.tools.max_tool_args_bytes == 262_144
    assert config.tools.read_file.max_file_read_bytes == 204_800 and config.tools.output.max_bytes == 102_400


def test_the_documented_layout_is_accepted() -> None:
    config = parse(
        """
[tools]
mode = "disabled"
max_tool_calls_per_batch = 3
[tools.sandbox]
denied_patterns = ["**/*.secret"]
[tools.timeouts]
default_seconds = 5
[tools.approval]
denylist = ["grep"]
"""
    )
    assert config.tools.mode == "disabled" and config.tools.max_tool_calls_per_batch == 3
    assert config.tools.sandbox.denied_patterns == ["**/*.secret"] and config.tools.approval.denylist == ["grep"]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[tools]\nmode = 'enabled'\nmax_tool_calls_per_bach = 3\n", 3, "unknown field `max_tool_calls_per_bach`"),
        ("[tools]\n\n[tools.sandbox]\nallow_absolute = 'yes'\n", 4, "Expected `bool`"),
        ("[tools.timeouts]\ndefault_seconds = -1\n", 2, ">"),
        ("[tools]\nmode = 'sometimes'\n", 2, "Invalid enum value"),
        ("[daemon]\nfinished_batches_kept_bytes = 0\n", 2, "Expected `int` >= 1"),
        ("[daemon]\n\nfinished_batches_kept_bytes = 'lots'\n", 3, "Expected `int`, got `str`"),
        ("[daemon]\nmax_uid_backlog_bytes = 4096\n", 2, "Expected `int` >= 1048576"),
        ("[journal]\nmax_bytes_per_uid = 4096\n", 2, "Expected `int` >= 1048576"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tmp_path / "toold.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}:{line}: ") and words in str(info.value)


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse("[tools\n", "x.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_file(tmp_path / "missing.toml")


def test_every_toml_block_in_the_readme_is_a_valid_config() -> None:
    import re
    from pathlib import Path

    from toold_daemon.config.loading import parse as parse_config

    readme = Path(__file__).resolve().parents[2] / "README.md"
    blocks = re.findall(r"```toml\n(.*?)```", readme.read_text(), re.S)
    assert len(blocks) >= 2
    for index, block in enumerate(blocks):
        parse_config(block, f"README.md toml block {index}")


def test_built_in_protected_patterns_can_be_dropped_one_by_one() -> None:
    from toold_daemon.sandbox import build_sandbox, protected_patterns, protects_homes

    config = parse(
        '[tools.sandbox]\nunprotected_patterns = ["**/*.pth", "~/.*"]\nprotected_patterns = ["**/Makefile"]\n'
    )
    patterns = protected_patterns(config)
    assert "**/*.pth" not in patterns and "**/.git/**" in patterns and patterns[-1] == "**/Makefile"
    assert not protects_homes(config) and protects_homes(parse(""))
    sandbox = build_sandbox(config, [Path("/tmp")])
    assert sandbox.protected_pattern("/tmp/x/site.pth") is None
    assert sandbox.protected_pattern("/tmp/x/Makefile") == "**/Makefile"
    with pytest.raises(ConfigError, match="not a built-in protected pattern"):
        parse('[tools.sandbox]\nunprotected_patterns = ["**/*.py"]\n')


EVERY_KIND_OF_MISTAKE = """\
[daemon]
max_sessions = "many"
socket_mode = 0o777
bogus = 1

[tools]
max_tool_calls_per_batch = 0

[tools.sandbox]
allowed_rootz = []

[[tools.approval.rules]]
tool = "shell"
decision = "allow"

[[tools.approval.rules]]
tool = "shell"
decision = "perhaps"

[[tools.approval.rules]]
tool = "read_file"
reason = "x"
decision = "deny"

[journal]
retention_days = -1
"""


def test_every_problem_in_a_file_is_reported_with_its_own_line(tmp_path: Path) -> None:
    """One problem per line, in the file's order, each where it is (a key inside the third
    rule is looked for below the third rule's header, not at the first rule's)."""
    path = tmp_path / "toold.toml"
    path.write_text(EVERY_KIND_OF_MISTAKE)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    reported = str(info.value).splitlines()
    assert [line.split(": ", 1)[0] for line in reported] == [f"{path}:{n}" for n in (2, 3, 4, 7, 10, 18, 22, 26)]
    assert "`$.daemon.max_sessions`" in reported[0] and "unknown field `bogus`" in reported[2]
    assert "'perhaps'" in reported[5] and "rules[1].decision" in reported[5]
    assert "unknown field `reason`" in reported[6] and "rules[2]" in reported[6]
    checked = subprocess.run([str(BIN / "toold"), "check-config", str(path)], capture_output=True, text=True)
    assert checked.returncode == 2
    assert checked.stderr.splitlines() == [f"toold: {line}" for line in reported]


def test_policy_and_command_tool_problems_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "toold.toml"
    path.write_text(
        """\
[[tools.approval.rules]]
tool = "shell"
decision = "allow"
conditions = [{ param = "command", operator = "matches", value = "(unclosed" }]

[[tools.commands]]
name = "read_file"
description = "clashes with the built-in"
argv = ["cat"]
"""
    )
    with pytest.raises(ConfigError) as info:
        load_file(path)
    reported = str(info.value).splitlines()
    assert len(reported) == 2, reported
    assert reported[0].startswith(f"policy refused: {path}:1: ") and "(unclosed" in reported[0]
    assert "read_file" in reported[1] and reported[1].startswith(f"{path}:6: ")
