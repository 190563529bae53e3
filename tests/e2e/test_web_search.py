"""web_search end to end: SearXNG- and Brave-shaped backends served locally in their
documented JSON shapes, the command backend, and a daemon without a backend."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Reply, Seen, Server, serving
from toold_client import APPROVE_ALL

KEY = "BSAk3yV4lu3-n0t-a-r34l-0ne-9f8e7d6c"


def _searx(seen: Seen, query: dict[str, list[str]]) -> Reply:
    assert query["format"] == ["json"]
    results = [
        {"title": f"SearX {query['q'][0]} {n}", "url": f"https://searx.example/{n}", "content": f"about <b>{n}</b>"}
        for n in range(30)
    ]
    return Reply(body=json.dumps({"query": query["q"][0], "results": results}).encode())


def _brave(seen: Seen, query: dict[str, list[str]]) -> Reply:
    if seen.headers.get("x-subscription-token") != KEY:
        return Reply(status=401, body=b'{"error": "bad token"}')
    count = int(query.get("count", ["20"])[0])
    results = [
        {"title": f"Brave &amp; {n}", "url": f"https://brave.example/{n}", "description": f"<strong>{n}</strong> hit"}
        for n in range(count)
    ]
    return Reply(body=json.dumps({"type": "search", "web": {"type": "search", "results": results}}).encode())


@pytest.fixture(scope="module")
def backend() -> Iterator[Server]:
    routes = {"/search": _searx, "/res/v1/web/search": _brave, "/broken/search": lambda s, q: Reply(body=b"<html>")}
    with serving("127.0.0.1", routes) as server:
        yield server


def _daemon(factory: pytest.TempPathFactory, name: str, section: str, **env: str) -> Any:
    return module_daemon(factory, name, f"[tools.web_search]\n{section}\n", env=env or None)


@pytest.fixture(scope="module")
def searx(tmp_path_factory: pytest.TempPathFactory, backend: Server) -> Iterator[DaemonProcess]:
    with _daemon(tmp_path_factory, "searx", f'backend = "searxng"\nurl = "{backend.url("")}"') as d:
        yield d


@pytest.fixture(scope="module")
def brave(tmp_path_factory: pytest.TempPathFactory, backend: Server) -> Iterator[DaemonProcess]:
    section = f'backend = "brave"\nurl = "{backend.url("/res/v1/web/search")}"\napi_key_env = "TEST_BRAVE_KEY"'
    with _daemon(tmp_path_factory, "brave", section, TEST_BRAVE_KEY=KEY) as d:
        yield d


SCRIPT = (
    "import json, sys; q = sys.argv[-1]; "
    "hits = [{'title': f'Cmd {q} {n}', 'url': f'https://cmd.example/{n}', 'snippet': 's'} for n in range(9)]; "
    "print(json.dumps(hits))"
)


def test_searxng_results_come_numbered_with_title_url_and_snippet(searx: DaemonProcess, backend: Server) -> None:
    with searx.client() as client:
        result = client.call("web_search", {"query": "cats"})
        assert result.ok, result.content
        assert result.content.startswith("1. SearX cats 0\n   https://searx.example/0\n   about 0\n2. SearX cats 1")
        assert result.data is not None and len(result.data["results"]) == 5  # the default
        first = {"title": "SearX cats 0", "url": "https://searx.example/0", "snippet": "about 0"}
        assert result.data["results"][0] == first
        many = client.call("web_search", {"query": "dogs", "num_results": 20})
        assert many.data is not None and len(many.data["results"]) == 20
        too_many = client.call("web_search", {"query": "dogs", "num_results": 21})
        assert too_many.error is not None and too_many.error.type == "BadArgs"
        assert client.explain("web_search", {"query": "x"}).decision == "allow"  # runs without asking


def test_brave_gets_the_key_in_its_header_and_the_key_is_seen_nowhere_else(
    brave: DaemonProcess, backend: Server
) -> None:
    with brave.client() as client:
        result = client.call("web_search", {"query": "toold", "num_results": 3})
        assert result.ok, result.content
        assert result.data is not None and [r["title"] for r in result.data["results"]] == [
            "Brave & 0",
            "Brave & 1",
            "Brave & 2",
        ]
        assert result.data["results"][0]["snippet"] == "0 hit"  # markup removed
        env = client.call("shell", {"command": "env"}, on_confirm=lambda r: APPROVE_ALL)
        assert env.ok and KEY not in env.content and "TEST_BRAVE_KEY" not in env.content
    assert backend.requests[-1].headers["x-subscription-token"] == KEY
    assert KEY not in result.content and KEY not in json.dumps(result.data)
    assert KEY not in brave.log.read_text()


def test_a_backend_that_fails_is_a_clear_error_without_the_key(
    tmp_path_factory: pytest.TempPathFactory, backend: Server
) -> None:
    section = f'backend = "brave"\nurl = "{backend.url("/res/v1/web/search")}"\napi_key_env = "TEST_BRAVE_KEY"'
    with _daemon(tmp_path_factory, "brave-wrong", section, TEST_BRAVE_KEY="wrong-" + KEY) as d, d.client() as client:
        result = client.call("web_search", {"query": "x"})
        assert result.error is not None and result.error.code == "SEARCH_FAILED" and "HTTP 401" in result.error.message
        assert KEY not in result.content
    broken = f'backend = "searxng"\nurl = "{backend.url("/broken")}"'
    with _daemon(tmp_path_factory, "searx-broken", broken) as d, d.client() as client:
        result = client.call("web_search", {"query": "x"})
        assert result.error is not None and result.error.code == "SEARCH_FAILED" and "JSON" in result.error.message
    missing = 'backend = "brave"\napi_key_env = "NO_SUCH_VARIABLE_HERE"'
    with _daemon(tmp_path_factory, "brave-nokey", missing) as d, d.client() as client:
        result = client.call("web_search", {"query": "x"})
        assert result.error is not None and "NO_SUCH_VARIABLE_HERE" in result.error.message


def test_the_command_backend_runs_as_a_command_and_its_json_is_read(tmp_path_factory: pytest.TempPathFactory) -> None:
    section = f'backend = "command"\ncommand = {json.dumps([sys.executable, "-c", SCRIPT])}'
    with _daemon(tmp_path_factory, "search-cmd", section) as d, d.client() as client:
        result = client.call("web_search", {"query": 'it\'s a "quoted" $(query)', "num_results": 7})
        assert result.ok, result.content
        assert result.data is not None and len(result.data["results"]) == 7
        assert result.data["results"][0]["title"] == 'Cmd it\'s a "quoted" $(query) 0'  # one argv word, no shell


def test_without_a_backend_web_search_is_not_offered_and_a_call_says_why(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        names = [t.name for t in client.tools()]  # type: ignore[union-attr]
        assert "web_search" not in names and "web_fetch" in names
        result = client.call("web_search", {"query": "x"})
    assert result.error is not None and result.error.code == "TOOL_NOT_CONFIGURED"
    assert "[tools.web_search] backend" in result.error.message
