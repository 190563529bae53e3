"""A daemon started with ``python -m toold_daemon`` from a workspace does not import the
workspace's files as modules.

Attack: the model writes ``httpx.py`` (and ``selectolax/``) into the workspace, which is
also the directory the administrator started the daemon in. Python puts that directory
first on the module path of ``-m``; the spawner imports web_fetch's HTTP stack after start
(as root), and a fresh web_fetch child would import it too. Neither may pick up the
workspace's copies: web_fetch must work, and the planted code must never run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import DaemonProcess, wait_ready
from tests.webserver import Server
from toold_client import APPROVE_ALL

PLANTED = "import pathlib\npathlib.Path({marker!r}).write_text('ran as uid %d' % __import__('os').getuid())\n"


def test_planted_modules_in_the_start_directory_never_run(tmp_path: Path, site: Server) -> None:
    root = tmp_path / "root"
    (root / "selectolax").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    for planted in (root / "httpx.py", root / "httpcore.py", root / "selectolax" / "__init__.py"):
        planted.write_text(PLANTED.format(marker=str(marker)))
    config = tmp_path / "toold.toml"
    config.write_text(
        f'[tools.web]\nallowed_networks = ["127.0.0.1/32"]\nallowed_ports = [{site.port}]\n'
        'trusted_hosts = ["127.0.0.1"]\n'
    )
    (tmp_path / "state").mkdir()
    sock = tmp_path / "run" / "toold.sock"
    args = [sys.executable, "-m", "toold_daemon", "serve", "--root", str(root), "--endpoint", f"ipc://{sock}"]
    args += ["--state-dir", str(tmp_path / "state"), "--config", str(config), "--log-level", "WARNING"]
    log = tmp_path / "daemon.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLD_ENDPOINT", "PYTHONSAFEPATH")}
    proc = subprocess.Popen(args, cwd=root, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    daemon = DaemonProcess(f"ipc://{sock}", root, sock, proc, log)
    try:
        wait_ready(daemon)
        time.sleep(0.5)  # the spawner warms web_fetch's stack once it has answered the start's probe
        with daemon.client() as client:
            result = client.call("web_fetch", {"url": site.url("/page")}, on_confirm=lambda r: APPROVE_ALL, timeout=60)
        assert result.ok, result.content
        assert not marker.exists(), marker.read_text()
    finally:
        daemon.stop()
