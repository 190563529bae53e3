"""The child environment rule: empty, allowlist in, secrets and injection hooks out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.sandbox.environment import child_environment, is_dropped

PARENT = {
    "PATH": "/usr/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TERM": "xterm",
    "EDITOR": "vim",
    "RANDOM_APP_SETTING": "x",
    "OPENAI_API_KEY": "sk",
    "LD_PRELOAD": "/evil.so",
}


def test_only_allowlisted_names_pass() -> None:
    env = child_environment(PARENT)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C", "TERM": "xterm"}


def test_config_allowlist_cannot_let_a_secret_or_hook_through() -> None:
    env = child_environment(PARENT, allow=["RANDOM_APP_SETTING", "OPENAI_API_KEY", "LD_*"])
    assert env["RANDOM_APP_SETTING"] == "x"
    assert "OPENAI_API_KEY" not in env and "LD_PRELOAD" not in env


def test_config_denylist_and_set_vars() -> None:
    env = child_environment(PARENT, deny=["TERM"], set_vars={"TMPDIR": "/tmp/x", "BASH_ENV": "/evil"})
    assert "TERM" not in env and env["TMPDIR"] == "/tmp/x" and "BASH_ENV" not in env


def test_a_missing_path_gets_a_default() -> None:
    assert child_environment({})["PATH"].startswith("/usr/local/sbin")


SECRETISH = st.sampled_from(
    ["API_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "AWS_", "ANTHROPIC_", "OPENAI_", "GITHUB_TOKEN", "DATABASE_URL"]
)


@given(prefix=st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,8}", fullmatch=True), secret=SECRETISH, lower=st.booleans())
def test_secret_shaped_names_are_dropped_in_any_case(prefix: str, secret: str, lower: bool) -> None:
    name = f"{prefix}_{secret}" if not secret.endswith("_") else f"{secret}{prefix}"
    name = name.lower() if lower else name
    assert is_dropped(name), name
    assert name not in child_environment({name: "v"}, allow=[name])
