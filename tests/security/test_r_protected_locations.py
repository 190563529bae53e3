"""Class R: the model cannot plant code in the user's own configuration.

The workspace is a home directory (as a user who opens their home would have it). Every
dot-entry directly in it, and Python's start-up hooks and tools' configuration anywhere,
are protected: built-in writes ask in every preset (even "all") unless an allowing rule
names the path, and commands find them read-only (the kernel, not the command line)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon, start_daemon
from toold_client import DENY_ALL
from toold_daemon.sandbox.homes import home_directories, home_dotfile, homes_within

CONFIG = """
[tools.approval]
preset = "all"

[[tools.approval.rules]]
tool = "write_file"
decision = "allow"
conditions = [{ param = "path", operator = "startsWith", value = ".config/myapp/" }]
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon whose root is a fresh directory in /home (a home by that rule alone)."""
    if not os.access("/home", os.W_OK):
        pytest.skip("needs to make a directory in /home")
    path = Path(f"/home/toold-r{os.getpid()}")
    path.mkdir()
    (path / "project").mkdir()
    (path / ".config").mkdir()
    (path / ".bashrc").write_text("# mine\n")
    # protected entries that exist when commands start (a zygote finds them once)
    (path / "project/.vscode").mkdir()
    (path / "project/.vscode/tasks.json").write_text("{}")
    (path / "project/sitecustomize.py").write_text("# mine\n")
    (path / "project/.config/git").mkdir(parents=True)  # protected as ".config/git/**" only
    (path / "project/.config/git/ignore").write_text("*.o\n")
    tmp = tmp_path_factory.mktemp("home")
    d = start_daemon(tmp, path, config=CONFIG)
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(path, ignore_errors=True)


PLANTS = [
    ("write_file", {"path": ".gitconfig", "content": "[core]\n\tfsmonitor = id\n"}),
    ("write_file", {"path": ".bash_aliases", "content": "alias ls='id;ls'\n"}),
    ("write_file", {"path": ".local/lib/python3.11/site-packages/evil.pth", "content": "import os\n"}),
    ("write_file", {"path": ".config/systemd/user/evil.service", "content": "[Service]\nExecStart=id\n"}),
    ("write_file", {"path": ".local/bin/sudo", "content": "#!/bin/sh\nid\n"}),
    ("write_file", {"path": ".ssh/rc", "content": "id\n"}),
    ("write_file", {"path": ".npmrc", "content": "script-shell=/tmp/x\n"}),
    ("write_file", {"path": "project/.venv/lib/python3.11/site-packages/x.pth", "content": "import os\n"}),
    ("write_file", {"path": "project/sitecustomize.py", "content": "import os\n", "overwrite": True}),
    ("write_file", {"path": "project/usercustomize.py", "content": "import os\n"}),
    ("write_file", {"path": "project/.vscode/extensions.json", "content": "{}"}),
    ("write_file", {"path": "project/.vscode/tasks.json", "content": "{}", "overwrite": True}),
    ("write_file", {"path": "project/pip.conf", "content": "[global]\n"}),
    ("write_file", {"path": ".bashrc", "content": "id\n", "overwrite": True}),
    ("edit_file", {"path": ".bashrc", "edits": [{"target": "# mine", "replacement": "id"}]}),
    ("apply_patch", {"patch": "*** Begin Patch\n*** Add File: .profile\n+id\n*** End Patch\n"}),
    ("move_file", {"source": "project/innocent.txt", "destination": ".xsessionrc"}),
    ("delete_file", {"path": ".bashrc"}),
]


@pytest.mark.parametrize(
    ("tool", "arguments"), PLANTS, ids=[str(a.get("path", a.get("destination", "patch"))) for _, a in PLANTS]
)
def test_writes_to_protected_locations_ask_even_under_preset_all(
    home: DaemonProcess, tool: str, arguments: dict[str, object]
) -> None:
    (home.root / "project/innocent.txt").write_text("id\n")
    with home.client(timeout=30) as c:
        explained = c.explain(tool, arguments)
        # asked about, naming why; or refused outright where a denied pattern holds (.ssh)
        assert (explained.decision, "protected" in explained.reason) == ("ask", True) or (
            explained.decision == "invalid" and "denied" in explained.reason
        ), explained
        result = c.call(tool, arguments, on_confirm=lambda request: DENY_ALL)
    assert not result.ok
    for name in (".gitconfig", ".bash_aliases", ".local", ".profile", ".xsessionrc", ".npmrc", ".ssh"):
        assert not (home.root / name).exists(), name
    assert (home.root / ".bashrc").read_text() == "# mine\n"
    assert not list((home.root / "project").rglob("*.pth"))


def test_a_home_dotfile_is_named_by_its_pattern(home: DaemonProcess) -> None:
    with home.client(timeout=30) as c:
        explained = c.explain("write_file", {"path": ".gitconfig", "content": "x"})
    assert "~/.*" in explained.reason


def test_an_allowing_rule_that_names_the_path_lets_a_protected_write_through(home: DaemonProcess) -> None:
    with home.client(timeout=30) as c:
        explained = c.explain("write_file", {"path": ".config/myapp/settings.toml", "content": "x"})
        assert explained.decision == "allow", explained
        assert c.call("write_file", {"path": ".config/myapp/settings.toml", "content": "x = 1\n"}).ok
        # ordinary files in the home and below it are written as before
        assert c.explain("write_file", {"path": "project/notes.md", "content": "x"}).decision == "allow"
    assert (home.root / ".config/myapp/settings.toml").read_text() == "x = 1\n"


@pytest.mark.parametrize(
    "command",
    [
        "printf '[core]\\n\\tfsmonitor = id\\n' > .gitconfig",
        "echo \"alias ls='id'\" >> .bashrc",
        "mkdir -p .local/bin && printf '#!/bin/sh\\nid\\n' > .local/bin/sudo",
        "mkdir -p .config/systemd/user && touch .config/systemd/user/x.service",
        "cp project/innocent.txt .profile",
        "ln -s project/innocent.txt .zshenv",
        "rm .bashrc",
        "mv .config .config-old",
        "touch project/sitecustomize.py.new && mv project/sitecustomize.py.new .pythonrc",
    ],
)
def test_commands_cannot_create_or_change_a_homes_dotfiles(home: DaemonProcess, command: str) -> None:
    """Attack: the same plants by an allowed command, which no per-path check sees."""
    (home.root / "project/innocent.txt").write_text("id\n")
    before = sorted(p.name for p in home.root.iterdir())
    with home.client(timeout=30) as c:
        result = c.call("shell", {"command": command})
    assert not result.ok, result.content
    assert sorted(p.name for p in home.root.iterdir()) == before
    assert (home.root / ".bashrc").read_text() == "# mine\n"


def test_commands_still_work_in_the_homes_ordinary_directories(home: DaemonProcess) -> None:
    with home.client(timeout=30) as c:
        result = c.call("shell", {"command": "echo made > project/made.txt && cat .bashrc && ls -a ."})
    assert result.ok, result.content
    assert "# mine" in result.content and ".config" in result.content
    assert (home.root / "project/made.txt").read_text() == "made\n"


def test_existing_protected_entries_below_the_root_are_read_only_for_commands(home: DaemonProcess) -> None:
    project = home.root / "project"
    with home.client(timeout=30) as c:
        for command in (
            "echo id > project/.vscode/tasks.json",
            "echo id >> project/sitecustomize.py",
            "printf '[core]\\n\\tfsmonitor = id\\n' > project/.config/git/config",
        ):
            result = c.call("shell", {"command": command})
            assert not result.ok, (command, result.content)
    assert (project / ".vscode/tasks.json").read_text() == "{}"
    assert not (project / ".config/git/config").exists()
    assert (project / "sitecustomize.py").read_text() == "# mine\n"


def test_homes_are_found_and_matched_as_paths() -> None:
    homes = frozenset({"/home/alice", "/srv/users/bob"})
    assert home_dotfile("/home/alice/.gitconfig", homes) == "/home/alice"
    assert home_dotfile("/home/alice/.local/bin/sudo", homes) == "/home/alice"
    assert home_dotfile("/home/alice/src/.git/config", homes) is None
    assert home_dotfile("/home/alice2/.gitconfig", homes) is None
    assert homes_within(["/home"], homes) == ["/home/alice"]
    assert homes_within(["/srv/users/bob"], homes) == ["/srv/users/bob"]
    assert homes_within(["/home/alice/src"], homes) == []
    assert "/root" in home_directories() and "/" not in home_directories()


PAST_THE_SEARCH = """
[tools.approval]
preset = "all"

[tools.sandbox]
hide_denied_max_entries = 50
"""


def test_protected_entries_past_the_search_make_the_layer_partial(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The search that finds protected entries (to show them read-only to commands) is
    bounded; one past it stays writable, so the layer says partial rather than "on" (a
    layer an administrator requires then refuses commands)."""
    with module_daemon(tmp_path_factory, "past-the-search", PAST_THE_SEARCH) as d:
        for i in range(200):
            (d.root / f"f{i:03}.txt").write_text("x\n")
        (d.root / "zz" / ".git" / "hooks").mkdir(parents=True)
        with d.client(timeout=30) as c:
            assert "hi" in c.call("shell", {"command": "echo hi"}).content
        deadline = time.monotonic() + 10
        while "protected_paths: partial" not in d.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "protected_paths: partial:" in d.log.read_text()
        assert "the search stopped after 50 entries" in d.log.read_text()
