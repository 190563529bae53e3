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
