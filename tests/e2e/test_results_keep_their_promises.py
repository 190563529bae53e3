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
