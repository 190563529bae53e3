"""pip, npm and git work through the egress proxy when their hosts are allowed.

git clones from a local HTTP server standing for a git host (a bare repository served
as files, git's "dumb" HTTP protocol). pip and npm reach the real package registries this
machine is configured with: their hosts are read from pip's and npm's own configuration
at test time, and the test is skipped where the machine cannot reach them itself.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from urllib.parse import urlsplit

import pytest

from tests.conftest import DaemonProcess, start_daemon

CA = "/etc/ssl/certs/ca-certificates.crt"


def exempt(hosts: list[str], port: int) -> list[str]:
    """The addresses these hosts resolve to here, as networks for allowed_networks (a
    mirror on a private or documentation address would otherwise be refused)."""
    found = {info[4][0] for host in hosts for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    return [f"{a}/128" if ":" in a else f"{a}/32" for a in sorted(found)]


def daemon_for(tmp: Path, hosts: list[str], networks: list[str], ports: list[int]) -> DaemonProcess:
    root = tmp / "root"
    root.mkdir()
    config = f"""
[tools.approval]
allowlist = ["shell"]

[tools.network]
allowed_domains = {json.dumps(hosts)}
allowed_networks = {json.dumps(networks)}
allowed_ports = {json.dumps(ports)}
"""
    return start_daemon(tmp, root, config=config)


def reachable(url: str) -> bool:
    done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "--max-time", "15", url], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[str]:
    if shutil.which("git") is None:
        pytest.skip("no git")
    served = tmp_path / "served"
    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    git = ["git", "-C", str(work), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(served / "repo.git"), "update-server-info"], check=True)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), partial(Quiet, directory=str(served)))
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/repo.git"
    finally:
        server.shutdown()
        server.server_close()


def test_git_clone_over_http_through_the_proxy(tmp_path: Path, git_server: str) -> None:
    port = urlsplit(git_server).port or 80
    d = daemon_for(tmp_path, ["127.0.0.2"], ["127.0.0.2/32"], [port])
    try:
        with d.client(timeout=60) as c:
            result = c.call("shell", {"command": f"HOME=$TMPDIR git clone -q {git_server} copy && cat copy/README"})
    finally:
        d.stop()
    assert result.ok and "cloned through the proxy" in result.content, result.content
    assert {r["host"] for r in result.data["network"]} == {"127.0.0.2"}


def test_pip_download_from_the_configured_index_through_the_proxy(tmp_path: Path) -> None:
    pip_index = pytest.importorskip("pip._internal.models.index")
    index, hosts = pip_index.PyPI.simple_url, [pip_index.PyPI.netloc, pip_index.PyPI.file_storage_domain]
    if not reachable(index):
        pytest.skip("the package index is not reachable from this machine")
    d = daemon_for(tmp_path, hosts, exempt(hosts, 443), [443])
    command = (
        f"PIP_CONFIG_FILE=/dev/null python3 -m pip download --no-deps --no-cache-dir --cert {CA} "
        f"--index-url {index} -d dl six==1.16.0 && ls dl"
    )
    try:
        with d.client(timeout=180) as c:
            result = c.call("shell", {"command": command, "timeout_ms": 150_000})
    finally:
        d.stop()
    assert result.ok and "six-1.16.0" in result.content, result.content
    assert {r["host"] for r in result.data["network"]} <= set(hosts)


def test_npm_pack_from_the_configured_registry_through_the_proxy(tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        pytest.skip("no npm")
    registry = subprocess.run(["npm", "config", "get", "registry"], capture_output=True, text=True, check=False)
    url = registry.stdout.strip() or "https://registry.npmjs.org/"
    host = urlsplit(url).hostname or ""
    if not reachable(url):
        pytest.skip("the npm registry is not reachable from this machine")
    d = daemon_for(tmp_path, [host], exempt([host], 443), [443])
    command = (
        f"NODE_EXTRA_CA_CERTS={CA} npm_config_cache=$TMPDIR/npm npm pack --silent --registry {url} is-number@7.0.0"
        " && ls *.tgz"
    )
    try:
        with d.client(timeout=180) as c:
            result = c.call("shell", {"command": command, "timeout_ms": 150_000})
    finally:
        d.stop()
    assert result.ok and "is-number-7.0.0.tgz" in result.content, result.content
    assert {r["host"] for r in result.data["network"]} == {host}
