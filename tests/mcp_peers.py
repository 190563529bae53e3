"""Real MCP peers from npm for the tests: the reference filesystem and everything
servers and the MCP Inspector's CLI, installed once (pinned) under .cache/npm."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PREFIX = REPO / ".cache" / "npm"
PACKAGES = {
    "@modelcontextprotocol/inspector": "0.15.0",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-everything": "2026.8.31",
}
STAMP = PREFIX / ("installed-" + "-".join(v for v in PACKAGES.values()))


def npm_bin(name: str) -> Path:
    """The path of an installed npm executable (``mcp-server-filesystem``, ...), installing
    the pinned packages on first use; skips the test where npm is missing."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("Node.js/npm not installed (scripts/bootstrap --dev installs them as root)")
    PREFIX.mkdir(parents=True, exist_ok=True)
    with (PREFIX / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not STAMP.exists():
            specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(PREFIX), *specs],
                check=True,
                timeout=600,
            )
            STAMP.touch()
    path = PREFIX / "node_modules" / ".bin" / name
    assert path.exists(), f"{name} is not among the installed npm executables"
    return path
