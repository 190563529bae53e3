"""What the spawner's warming leaves for a fetch's child to do: every ``web_fetch`` runs
in a child forked from the spawner, so a module the real request path imports on first
use, and the warming does not, is imported again in every call's child (the ``idna``
codec and ``stringprep``, which Python's socket module loads for the first host name it
encodes, cost each fetch about 1.5 ms)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import msgspec

    # The server lives in a process of its own: serving from this one would have it
    # encode a host name first, and so import what the test looks for.
    port_read, port_write = os.pipe()
    server = os.fork()
    if server == 0:
        from tests.webserver import serving
        with serving("127.0.0.1") as site:
            os.write(port_write, site.url("/json").encode())
            signal.pause()
    url = os.read(port_read, 1000).decode()

    from toold_daemon.config import Config
    from toold_daemon.tools.web_fetch import reach_of
    from toold_daemon.web import fetch

    fetch.warm_up()  # what the spawner does before it forks fetches
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    web = msgspec.structs.replace(Config().tools.web, allowed_networks=["127.0.0.1/32"], allowed_ports=[port])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = set(sys.modules)
        response = fetch.fetch(
            fetch.Request(url, "GET", {}, None),
            reach_of(web),
            max_download_bytes=1 << 20,
            max_redirects=0,
            deadline=time.monotonic() + 10,
            cancelled=threading.Event(),
        )
        new = sorted(set(sys.modules) - before)
        os.write(write, f"{response.status} {new}".encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 65536).decode())
    os.waitpid(pid, 0)
    os.kill(server, signal.SIGKILL)
    os.waitpid(server, 0)
    """
)


def test_a_fetch_forked_after_the_warming_imports_nothing() -> None:
    # A fresh interpreter: the test session has imported far more than the spawner does.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    status, new = done.stdout.strip().split(" ", 1)
    assert status == "200"
    assert new == "[]", f"imported in the fetch's child: {new}"
