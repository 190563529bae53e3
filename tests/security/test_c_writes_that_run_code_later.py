"""Class C: writes that make other programs run code later (git hooks and config, editor
tasks, direnv, dev containers, shell start-up files) ask first, and commands see `.git`
read-only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import DENY_ALL

# The default policy (create without asking) plus commands allowed, as an agent host would.
CONFIG = """
[tools.approval]
allowlist = ["shell", "run_code"]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "protected", CONFIG) as d:
        (d.root / ".git/hooks").mkdir(parents=True)
        (d.root / ".git/config").write_text("[core]\n")
        yield d


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\nid\n"}),
        ("write_file", {"path": ".git/config", "content": "[core]\nfsmonitor = id\n", "overwrite": True}),
        ("write_file", {"path": "sub/.git", "content": "gitdir: /tmp/evil\n"}),
        ("write_file", {"path": ".gitmodules", "content": "[submodule]\n"}),
        ("write_file", {"path": ".envrc", "content": "id\n"}),
        ("write_file", {"path": ".vscode/tasks.json", "content": "{}"}),
        ("write_file", {"path": ".vscode/settings.json", "content": "{}"}),
        ("write_file", {"path": ".idea/workspace.xml", "content": "<x/>"}),
        ("write_file", {"path": ".devcontainer/devcontainer.json", "content": "{}"}),
        ("write_file", {"path": ".bashrc", "content": "id\n"}),
        ("apply_patch", {"patch": "*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+id\n*** End Patch\n"}),
        ("move_file", {"source": "innocent.txt", "destination": ".git/hooks/pre-push"}),
    ],
)
def test_built_in_writes_to_protected_places_ask(
    daemon: DaemonProcess, tool: str, arguments: dict[str, object]
) -> None:
    """Attack: plant a file that runs outside every sandbox layer the next time the user
    types `git status` or opens the editor. Creating such a file is asked about too."""
    (daemon.root / "innocent.txt").write_text("id\n")
    with daemon.client(timeout=30) as c:
        explained = c.explain(tool, arguments)
        assert explained.decision != "allow", explained
        # .envrc is denied outright (it also starts with .env); the rest ask, naming why
        assert explained.decision == "invalid" or "protected" in explained.reason or "overwrite" in str(arguments)
        result = c.call(tool, arguments, on_confirm=lambda request: DENY_ALL)
    assert not result.ok
    assert not (daemon.root / ".git/hooks/pre-commit").exists()
    assert not (daemon.root / ".envrc").exists()


def test_ordinary_files_are_still_created_without_asking(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=30) as c:
        assert c.explain("write_file", {"path": "src/gitignore-notes.txt", "content": "x"}).decision == "allow"
        assert c.explain("write_file", {"path": "docs/.github/x.md", "content": "x"}).decision == "allow"


@pytest.mark.parametrize(
    "command",
    [
        "echo id > .git/hooks/pre-commit",
        "printf '[core]\\nfsmonitor = id\\n' >> .git/config",
        "rm -rf .git/hooks",
        "mv .git .git-old",
        "touch .git/description",
        "ln -s /tmp/x .git/hooks/post-merge",
    ],
)
def test_commands_see_git_read_only(daemon: DaemonProcess, command: str) -> None:
    """Attack: the same plant by a command (allowed by the policy), which no per-path rule
    sees: the kernel keeps .git read-only for commands."""
    before = sorted(p.name for p in (daemon.root / ".git").rglob("*"))
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": command})
        readable = c.call("shell", {"command": "cat .git/config"})
    assert not result.ok, result.content
    assert "Read-only file system" in result.content or "busy" in result.content  # mv of the mount: EBUSY
    assert sorted(p.name for p in (daemon.root / ".git").rglob("*")) == before
    assert (daemon.root / ".git/config").read_text() == "[core]\n"
    assert readable.ok and "[core]" in readable.content
