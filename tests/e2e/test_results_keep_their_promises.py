"""Results stay inside the limits they promise: an error result is no longer than
``max_bytes`` and says when it was cut."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import DaemonProcess, module_daemon

CONFIG = "[tools.output]\nmax_bytes = 2000\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "promises", CONFIG) as d:
        yield d


@pytest.mark.parametrize(
    "path",
    ["missing-" + "x" * 3600 + ".txt", "../" + "y" * 3600, "a/" * 1800 + "z.txt"],
    ids=["not found", "traversal", "deep"],
)
def test_an_error_about_a_long_path_fits_max_bytes(daemon: DaemonProcess, path: str) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("read_file", {"path": path})
    assert not result.ok
    assert len(result.content.encode()) <= 2000, len(result.content.encode())
    assert result.truncated and result.content.startswith("Error (")
    assert len(result.error.message.encode()) <= 2000


@pytest.mark.parametrize("max_length", [5, 20, 40])
def test_web_fetch_with_a_very_short_max_length_returns_text_and_says_it_was_cut(
    tmp_path_factory: pytest.TempPathFactory, max_length: int
) -> None:
    from tests.webserver import serving

    with serving() as site:
        config = f"""
[tools.approval]
preset = "all"
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}]
"""
        with module_daemon(tmp_path_factory, f"short-{max_length}", config) as d, d.client(timeout=30) as c:
            whole = c.call("web_fetch", {"url": site.url("/json")})
            result = c.call("web_fetch", {"url": site.url("/json"), "max_length": max_length})
    assert result.ok and len(whole.content) > max_length, result.content
    assert result.content == whole.content[:max_length]  # text, not a marker alone
    assert result.truncated and result.data["truncated"] is True and not whole.truncated


def test_deleting_a_missing_file_fails_at_planning_without_asking(daemon: DaemonProcess) -> None:
    asked: list[object] = []
    with daemon.client(timeout=30) as c:
        result = c.call("delete_file", {"path": "never-was.txt"}, on_confirm=lambda r: asked.append(r))
    assert not result.ok and result.error.code == "FILE_NOT_FOUND" and not asked


def test_commands_name_where_they_act_in_their_confirmation(daemon: DaemonProcess) -> None:
    seen: list[list[str]] = []

    def look(request: object) -> object:
        from toold_client import DENY_ALL

        seen.extend(item.locations for item in request.calls)  # type: ignore[attr-defined]
        return DENY_ALL

    (daemon.root / "sub").mkdir(exist_ok=True)
    with daemon.client(timeout=30) as c:
        c.call("shell", {"command": "true"}, on_confirm=look)
        c.call("shell", {"command": "true", "cwd": "sub"}, on_confirm=look)
        c.call("run_code", {"language": "python", "code": "pass"}, on_confirm=look)
    assert seen == [["."], ["sub"], ["."]]


def test_a_denylisted_tool_is_not_offered(tmp_path_factory: pytest.TempPathFactory) -> None:
    config = '[tools.approval]\ndenylist = ["shell", "run_code"]\n'
    with module_daemon(tmp_path_factory, "denylisted", config) as d, d.client(timeout=30) as c:
        names = {t.name for t in c.tools()}  # type: ignore[union-attr]
        openai = c.tools(format="openai")
    assert "read_file" in names and not names & {"shell", "run_code"}
    exported = {(item.get("function") or item).get("name") for item in openai}  # type: ignore[union-attr]
    assert "read_file" in exported and not exported & {"shell", "run_code"}


def test_network_errors_name_the_url_and_give_details_a_program_can_use(daemon: DaemonProcess) -> None:
    from toold_client import APPROVE_ALL

    url = "http://no-such-host.invalid/some/page?token=secret-value"
    with daemon.client(timeout=30) as c:
        result = c.call("web_fetch", {"url": url}, on_confirm=lambda r: APPROVE_ALL)
    assert not result.ok and result.error.code == "DNS_FAILED"
    assert "GET http://no-such-host.invalid/some/page" in result.error.message
    assert "secret-value" not in result.content
    details = result.error.details
    assert details["kind"] == "dns_failed" and details["host"] == "no-such-host.invalid" and details["port"] == 80


def test_a_delete_of_what_an_earlier_call_makes_is_not_refused_at_planning(daemon: DaemonProcess) -> None:
    """Planning looks at the disk as it is: after a call that may change it, the later
    calls are checked when they run, not before."""
    from toold_client import APPROVE_ALL, CallSpec

    with daemon.client(timeout=30) as c:
        outcome = c.submit(
            [
                CallSpec("write_file", {"path": "later/x.txt", "content": "x"}, "w"),
                CallSpec("delete_file", {"path": "later", "recursive": True}, "d"),
            ],
            on_confirm=lambda r: APPROVE_ALL,
        )
    assert [r.ok for r in outcome.results] == [True, True], [r.content for r in outcome.results]
    assert not (daemon.root / "later").exists()
