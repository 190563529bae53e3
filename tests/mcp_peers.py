"""Real MCP peers from npm for the tests: the reference filesystem and everything
servers and the MCP Inspector's CLI, installed once (pinned).

As root they are installed once per machine, under /var/cache (which only root may write
and every user may read: some tests run the peers as other users), so that a fresh
checkout does not spend half a minute installing them again; otherwise under the
checkout's .cache/npm."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {
    "@modelcontextprotocol/inspector": "0.15.0",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-everything": "2026.8.31",
}
PINNED = "-".join(v for v in PACKAGES.values())
PREFIX = Path("/var/cache/toold-tests/npm-" + PINNED) if os.geteuid() == 0 else REPO / ".cache" / "npm"
STAMP = PREFIX / ("installed-" + PINNED)


def npm_bin(name: str) -> Path:
    """The path of an installed npm executable (``mcp-server-filesystem``, ...), installing
    the pinned packages on first use; skips the test where npm is missing."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("Node.js/npm not installed (scripts/bootstrap --dev installs them as root)")
    PREFIX.mkdir(parents=True, exist_ok=True)
    for directory in (PREFIX.parent, PREFIX):  # readable by the other users whatever the umask
        if directory.stat().st_uid == os.geteuid():
            directory.chmod(0o755)
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
