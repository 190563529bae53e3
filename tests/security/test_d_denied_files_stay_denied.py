"""Class D: denied files stay denied for commands too. Two layers: the command's zygote
covers every denied file below the roots with an empty read-only stand-in (kernel), and a
command whose words name a denied path — directly, through an option, a symlink or a
glob — is asked about (policy). Built-in tools refuse hard links to denied files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import DENY_ALL

SECRET = "SECRET_TOKEN=hunter2-do-not-leak"
KEY = "-----BEGIN OPENSSH PRIVATE KEY----- sesame"

# Everything runs unasked (preset "all"): only the two layers under test stand between a
# command and the secrets.
YOLO = """
[tools.approval]
preset = "all"
"""
# Commands allowed by rules, the way an agent host configures a trusted toolbox.
RULES = """
[tools.approval]
[[tools.approval.rules]]
tool = "shell"
decision = "allow"
conditions = [{ param = "command", operator = "prefix", value = ["cat", "grep", "cp", "ls", "head", "wc", "ln"] }]
"""


def _plant(root: os.PathLike[str]) -> None:
    base = os.fspath(root)
    with open(os.path.join(base, ".env"), "w") as f:
        f.write(SECRET + "\n")
    with open(os.path.join(base, ".env-production"), "w") as f:
        f.write(SECRET + "\n")
    os.makedirs(os.path.join(base, "deploy/.ssh"), exist_ok=True)
    with open(os.path.join(base, "deploy/.ssh/id_ed25519"), "w") as f:
        f.write(KEY + "\n")
    with open(os.path.join(base, "server.pem"), "w") as f:
        f.write(KEY + "\n")
    with open(os.path.join(base, "readme.txt"), "w") as f:
        f.write("public\n")
    if not os.path.lexists(os.path.join(base, "notes")):
        os.symlink(".env", os.path.join(base, "notes"))
    # Second names made before the agent came: one for a denied file, one for a file in a
    # denied directory.
    if not os.path.lexists(os.path.join(base, "meeting-notes.txt")):
        os.link(os.path.join(base, ".env"), os.path.join(base, "meeting-notes.txt"))
    if not os.path.lexists(os.path.join(base, "deploy", "readme.md")):
        os.link(os.path.join(base, "deploy/.ssh/id_ed25519"), os.path.join(base, "deploy", "readme.md"))


@pytest.fixture(scope="module")
def yolo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "hidden", YOLO) as d:
        _plant(d.root)  # before the first command starts the workspace's zygote
        yield d


@pytest.fixture(scope="module")
def ruled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "named", RULES) as d:
        _plant(d.root)
        yield d


@pytest.mark.parametrize(
    "command",
    [
        "cat $(printf .e)nv",  # the policy cannot see the name: only the kernel layer holds
        "grep -r SECRET_TOKEN . ; grep -r BEGIN . ; true",
        "cp $(printf .e)nv copy && cat copy",
        "for f in ./*.p[e]m deploy/.[s]sh/*; do cat $f; done",
        "for f in .e*; do cat $f; done",
        "(cd deploy && for d in .[s]sh; do cat $d/id_ed25519; ls -a $d; done)",
        "cat $(printf no)tes",  # a symlink to a denied file reads the stand-in
        "tar cf - . 2>/dev/null | strings",
        "cat meeting-notes.txt deploy/readme.md",  # hard links made before the agent came
        # Lift the stand-ins first (the command has no capability to unmount them)
        "umount $(printf .e)nv; umount -l deploy/$(printf .s)sh; cat $(printf .e)nv; "
        "for f in deploy/.[s]sh/*; do cat $f; done",
    ],
)
def test_commands_cannot_read_denied_files(yolo: DaemonProcess, command: str) -> None:
    """Attack: read a secret with a command the built-in path checks never see: by name
    built at run time, recursively, through a copy, a glob, a loop or a symlink."""
    with yolo.client(timeout=30) as c:
        result = c.call("shell", {"command": f"{command}; cat readme.txt"})
    assert "public" in result.content, result.content  # the command did run
    assert SECRET not in result.content, result.content
    assert "sesame" not in result.content, result.content


def test_hidden_files_are_still_there_for_the_user(yolo: DaemonProcess) -> None:
    """The stand-ins live in the command's mount namespace only: nothing is changed on disk,
    and a command cannot write through them (writes go nowhere, the directory is read-only)."""
    with yolo.client(timeout=30) as c:
        c.call("shell", {"command": "echo pwned > $(printf .e)nv; echo x > deploy/$(printf .s)sh/planted"})
    assert (yolo.root / ".env").read_text() == SECRET + "\n"
    assert not (yolo.root / "deploy/.ssh/planted").exists()


def test_a_hard_link_to_a_hidden_file_cannot_be_made(yolo: DaemonProcess) -> None:
    """Attack: hard-link the secret under an innocent name, then read it with read_file."""
    with yolo.client(timeout=30) as c:
        c.call("shell", {"command": "ln $(printf .e)nv innocent.txt; ln deploy/$(printf .s)sh/id_ed25519 k.txt"})
        assert not (yolo.root / "innocent.txt").exists()
        assert not (yolo.root / "k.txt").exists()


@pytest.mark.parametrize(
    "command",
    [
        "cat .env",
        "cat ./.env-production",
        "grep SECRET .env_local .env",
        "cp .env /tmp/x",
        "cat notes",  # a symlink to .env
        "cat .e*",
        "cat *",  # expands to server.pem and notes
        "head -n1 deploy/.ssh/id_ed25519",
        "wc --files0-from=.env",
        "cat ~/.ssh/id_rsa",
        "ln .env innocent",
    ],
)
def test_commands_naming_denied_files_ask(ruled: DaemonProcess, command: str) -> None:
    """Attack: an allow rule for `cat`/`grep`/`cp` must not carry a command that names a
    denied file, however it is spelled."""
    with ruled.client(timeout=30) as c:
        explained = c.explain("shell", {"command": command})
        assert explained.decision == "ask", explained
        assert "denied file" in explained.reason, explained
        result = c.call("shell", {"command": command}, on_confirm=lambda request: DENY_ALL)
    assert not result.ok
    assert SECRET not in result.content


@pytest.mark.parametrize("command", ["cat readme.txt", "grep -r public *.txt", "ls -la", "cat *.txt"])
def test_commands_naming_nothing_denied_still_run(ruled: DaemonProcess, command: str) -> None:
    """The lexical check must not ask about ordinary commands (a glob is expanded against
    the directory, not guessed)."""
    with ruled.client(timeout=30) as c:
        assert c.explain("shell", {"command": command}).decision == "allow"


def test_a_hard_link_to_a_denied_file_is_denied_to_built_in_tools(ruled: DaemonProcess) -> None:
    """Attack: a second name for `.env` (made outside toold, or before) read by read_file,
    grep or read_many_files."""
    link = ruled.root / "innocent-link.txt"
    if not link.exists():
        os.link(ruled.root / ".env", link)
    with ruled.client(timeout=30) as c:
        read = c.call("read_file", {"path": "innocent-link.txt"})
        many = c.call("read_many_files", {"paths": ["innocent-link.txt"]})
        grep = c.call("grep", {"pattern": "SECRET_TOKEN"})
    assert not read.ok and read.error is not None and read.error.code == "DENIED_PATTERN", read
    assert SECRET not in many.content
    assert SECRET not in grep.content


@pytest.mark.parametrize("path", ["meeting-notes.txt", "deploy/readme.md"])
def test_a_second_name_made_before_is_denied_to_built_in_tools(ruled: DaemonProcess, path: str) -> None:
    """Attack: read a secret (a denied file, or one inside a denied directory) through a
    hard link with an innocent name that was already there."""
    with ruled.client(timeout=30) as c:
        result = c.call("read_file", {"path": path})
    assert not result.ok and result.error is not None and result.error.code == "DENIED_PATTERN", result
    assert SECRET not in result.content and "sesame" not in result.content


def test_a_file_with_other_innocent_links_is_readable(ruled: DaemonProcess) -> None:
    """Hard links in themselves are fine (pnpm's store uses them): only links to a denied
    file are refused."""
    (ruled.root / "a.txt").write_text("shared\n")
    if not (ruled.root / "b.txt").exists():
        os.link(ruled.root / "a.txt", ruled.root / "b.txt")
    with ruled.client(timeout=30) as c:
        result = c.call("read_file", {"path": "b.txt"})
    assert result.ok and "shared" in result.content


def test_a_command_too_long_to_check_word_by_word_asks(ruled: DaemonProcess) -> None:
    """Attack: bury `.env` among thousands of words so that the check gives up, or make
    the daemon stat every one of them on its event loop."""
    command = "cat " + " ".join(["readme.txt"] * 600) + " .env"
    with ruled.client(timeout=30) as c:
        explained = c.explain("shell", {"command": command})
        # the reader gives up first (past 512 words), and the command asks
        assert explained.decision == "ask" and "more than 512 words" in explained.reason
        # below that, the word is found wherever it is buried
        explained = c.explain("shell", {"command": "cat " + " ".join(["readme.txt"] * 500) + " .env"})
        assert explained.decision == "ask" and ".env" in explained.reason, explained.reason
        assert c.ping(timeout=5) < 5  # the daemon still answers


@pytest.mark.parametrize("path", ["notes", "keys/id_ed25519", "keys/../notes"])
def test_a_relative_symlink_to_a_denied_file_is_denied_to_built_in_tools(ruled: DaemonProcess, path: str) -> None:
    """Attack: a name with no link on the way is its own canonical name, found in one
    lookup; a relative link (`notes -> .env`, `keys -> deploy/.ssh`) stays below the root
    and must still be followed to the denied name it leads to, not taken for itself."""
    if not os.path.lexists(ruled.root / "keys"):
        os.symlink("deploy/.ssh", ruled.root / "keys")
    with ruled.client(timeout=30) as c:
        result = c.call("read_file", {"path": path})
    assert not result.ok and result.error is not None, result
    assert result.error.code in ("DENIED_PATTERN", "PATH_TRAVERSAL"), result
    assert SECRET not in result.content and "sesame" not in result.content


def test_a_relative_symlink_to_a_public_file_is_read_through(ruled: DaemonProcess) -> None:
    if not os.path.lexists(ruled.root / "readme-link"):
        os.symlink("readme.txt", ruled.root / "readme-link")
    with ruled.client(timeout=30) as c:
        result = c.call("read_file", {"path": "readme-link"})
    assert result.ok and "public" in result.content, result


def test_a_workspace_made_anew_is_judged_as_it_is_now(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Attack: the workspace is made anew under the daemon (removed and cloned again, the
    clone an attacker's repository) with a link to a denied file where a plain file was.
    A command naming the link is judged by the workspace as it is now: asked about, as
    in a workspace that always had the link, never allowed by what the old tree said."""
    with module_daemon(tmp_path_factory, "made-anew", RULES) as d:
        (d.root / "notes").write_text("plain\n")
        with d.client(timeout=30) as c:
            assert c.explain("shell", {"command": "cat notes"}).decision == "allow"
            os.rename(d.root, d.root.with_name("aside"))
            d.root.mkdir()
            _plant(d.root)  # .env, and notes -> .env
            explained = c.explain("shell", {"command": "cat notes"})
            assert explained.decision == "ask", explained
            assert "denied file" in explained.reason, explained
            result = c.call("shell", {"command": "cat notes"}, on_confirm=lambda request: DENY_ALL)
    assert not result.ok and SECRET not in result.content, result.content
