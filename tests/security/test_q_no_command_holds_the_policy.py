"""Class Q: no command holds the daemon while the policy reads it.

The policy reads a shell command in the daemon itself (the protocol process) before
anything runs. Three of its regular expressions backtracked on a model's input: a sed
address of 40 backslashes took hours (2^n ways to read a run of them), a brace word of
60 KB of commas 17 s, an awk program of 64 KB of blanks seconds; Python's ``re`` holds
the interpreter meanwhile, so every client of the daemon waited. Attack: such commands,
against a real daemon, while another client pings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon
from toold_client import Client
from toold_daemon.policy import options, shell

CONFIG = '[tools.approval]\nallowlist = ["shell"]\n'

ATTACKS = {
    "sed address of backslashes": "sed -e '\\#" + "\\" * 60 + "x' f",
    "sed address, no delimiter closing it": "sed -e '/" + "\\" * 30_000 + "' f",
    "brace word of commas": "echo {" + "," * 60_000,
    "awk program of blanks": "awk '|" + " " * 60_000 + "x' f",
}


@pytest.mark.parametrize("command", ATTACKS.values(), ids=ATTACKS.keys())
def test_reading_the_command_takes_time_linear_in_it(command: str) -> None:
    """The command read into words, then its programs' options weighed."""
    started = time.perf_counter()
    parts = shell.split_command(command)
    for part in parts or []:
        options.hazards(part.words)
    assert time.perf_counter() - started < 1.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "policy-reads", CONFIG) as d:
        (d.root / "f").write_text("x\n")
        yield d


@pytest.mark.parametrize("command", ATTACKS.values(), ids=ATTACKS.keys())
def test_another_client_is_answered_while_such_a_command_is_judged(daemon: DaemonProcess, command: str) -> None:
    judged: list[float] = []

    def attacker() -> None:
        with Client(daemon.endpoint, timeout=60) as c:
            started = time.perf_counter()
            c.explain("shell", {"command": command})
            judged.append(time.perf_counter() - started)

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    pings = []
    with Client(daemon.endpoint, timeout=10) as victim:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pings.append(victim.ping(timeout=10))
            time.sleep(0.02)
    thread.join(30)
    assert judged and judged[0] < 2.0, judged
    assert max(pings) < 0.5, max(pings)
    assert daemon.proc.poll() is None


def test_a_glob_of_many_long_alternatives_is_judged_at_once_and_compiled_within_a_bound() -> None:
    """Tool arguments are validated in the daemon too: the glob tool compiled its pattern
    there, and 900 characters before eight braces (256 alternatives of ~1 KB) took a
    second. Validation now only expands the braces, and their total size is bounded."""
    from toold_daemon.errors import ToolError
    from toold_daemon.globmatch import compile_glob
    from toold_daemon.tools.glob import Glob, GlobArgs

    refused = GlobArgs(pattern="x" * 900 + "{a,b}" * 8 + "*c")
    started = time.perf_counter()
    with pytest.raises(ToolError) as info:
        Glob().validate(refused)
    assert info.value.code == "BAD_ARGS" and time.perf_counter() - started < 0.05
    largest = "x" * 50 + "{a,b}" * 8 + "*c*d*e"  # 16 KB expanded: admitted
    Glob().validate(GlobArgs(pattern=largest))
    started = time.perf_counter()
    compile_glob(largest)  # in the worker
    assert time.perf_counter() - started < 0.5
