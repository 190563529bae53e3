"""Output bounds that tell the truth: the truncation marker counts, in bytes and lines,
everything a command printed that the result does not show, including what was dropped
while streaming; error results obey the same limits; the exit code is never cut away."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import DaemonProcess, module_daemon

MAX_BYTES = 2000
MAX_LINES = 40
CONFIG = f"""
[tools.approval]
allowlist = ["shell"]

[tools.output]
max_bytes = {MAX_BYTES}
max_lines = {MAX_LINES}
"""
MARKER = re.compile(r"\[output truncated: (at least )?(\d+) bytes, (at least )?(\d+) lines omitted\]")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "truncation", CONFIG) as d:
        yield d


def _lines(data: str) -> int:
    return data.count("\n") + (0 if not data or data.endswith("\n") else 1)


def _check(content: str, printed: str, *, error_prefix: bool) -> None:
    """The marker's counts are what ``printed`` has beyond what ``content`` shows."""
    assert len(content.encode()) <= MAX_BYTES, len(content.encode())
    assert _lines(content) <= MAX_LINES, _lines(content)
    found = MARKER.search(content)
    assert found is not None, content[-300:]
    shown = content[: found.start()]
    if error_prefix:
        shown = shown.split("\n\n", 1)[1]
    shown = shown.removesuffix("\n") if not printed.startswith(shown) else shown
    assert printed.startswith(shown), (shown[-80:], printed[: len(shown)][-80:])
    assert int(found.group(2)) == len(printed.encode()) - len(shown.encode())
    assert int(found.group(4)) == _lines(printed) - _lines(shown)


line_lengths = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=400)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=line_lengths, final_newline=st.booleans(), fail=st.booleans())
def test_the_marker_counts_what_was_really_omitted(
    daemon: DaemonProcess, lengths: list[int], final_newline: bool, fail: bool
) -> None:
    printed = "\n".join(f"{i}:" + "x" * n for i, n in enumerate(lengths)) + ("\n" if final_newline else "")
    (daemon.root / "out.txt").write_text(printed)
    command = "cat out.txt" + ("; exit 3" if fail else "")
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": command})
    assert result.ok is not fail
    content = result.content
    assert content.rstrip().endswith(f"[exit code {3 if fail else 0}]"), content[-200:]
    assert len(content.encode()) <= MAX_BYTES and _lines(content) <= MAX_LINES
    fits = len(printed.encode()) + 20 <= MAX_BYTES - 100 and _lines(printed) + 2 <= MAX_LINES - 2
    if result.truncated:
        _check(content, printed, error_prefix=fail)
    else:
        assert fits or printed in content


def test_a_huge_output_reports_its_real_size(daemon: DaemonProcess) -> None:
    """3 MB of output must not say "about 100 bytes omitted"; 20,000 lines of seq must
    not say 8921 lines."""
    with daemon.client(timeout=60) as c:
        big = c.call("shell", {"command": "head -c 3000000 /dev/zero | tr '\\0' 'a'; echo"})
        seq = c.call("shell", {"command": "seq 1 20000"})
    printed_seq = "".join(f"{i}\n" for i in range(1, 20001))
    _check(seq.content, printed_seq, error_prefix=False)
    found = MARKER.search(big.content)
    assert found is not None and int(found.group(2)) > 2_990_000, big.content[-200:]
    assert big.truncated and seq.truncated


def test_error_results_obey_the_limits(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": "seq 1 5000; exit 7"})
    assert not result.ok and result.truncated
    assert len(result.content.encode()) <= MAX_BYTES and _lines(result.content) <= MAX_LINES
    assert result.content.startswith("Error (ExecutionFailed): exit code 7")
    assert result.content.rstrip().endswith("[exit code 7]")
    _check(result.content, "".join(f"{i}\n" for i in range(1, 5001)), error_prefix=True)


def test_a_stray_byte_does_not_hide_the_output(daemon: DaemonProcess) -> None:
    """One byte that is not UTF-8 in otherwise readable output: the lines stay."""
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": "printf 'first line\\n\\377\\nlast line\\n'"})
        short = c.call("shell", {"command": "printf 'a\\n\\377\\nb\\n'"})
        mostly_binary = c.call("shell", {"command": "head -c 3000 /dev/urandom"})
    assert "first line" in result.content and "last line" in result.content
    assert short.content.startswith("a\n\ufffd\nb\n"), short.content
    assert "binary output" in mostly_binary.content


def test_a_timed_out_command_keeps_its_cut_output(daemon: DaemonProcess) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": "seq 1 5000; sleep 30", "timeout_ms": 1500})
    assert not result.ok and result.error is not None and result.error.code == "TIMEOUT"
    assert result.truncated
    assert len(result.content.encode()) <= MAX_BYTES and _lines(result.content) <= MAX_LINES
    assert "1\n2\n3\n" in result.content
    assert MARKER.search(result.content) is not None
