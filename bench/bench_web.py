"""Cost of ``web_fetch``: a small JSON document and an HTML page from a server on
127.0.0.1, through a running daemon and the client, against ``httpx.get`` of the same
URL in this process (a fresh client per request with a TLS context loaded once, as web_fetch does) and a bare fork,
measured in the same run.

What the ratio buys: a confined child per call with the network open, the address
checks, a fresh connection, and the page turned into text.
"""

from __future__ import annotations

import ssl
import sys
import tempfile
from pathlib import Path

import httpx

from _common import report, running_daemon, sample
from bench_spawn import bare_fork
from toold_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' HTTP server
from tests.webserver import serving

N = 200


def main() -> None:
    with serving("127.0.0.1") as site, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        config = Path(tmp, "toold.toml")
        config.write_text(
            f'[tools.web]\nallowed_networks = ["127.0.0.1/32"]\nallowed_ports = [{site.port}]\n'
            'trusted_hosts = ["127.0.0.1"]\n'
        )
        tls = ssl.create_default_context()  # loaded once, as the daemon does
        fork = sample(bare_fork, N)
        report("bare fork", fork)
        with running_daemon(root, "--config", str(config)) as endpoint, Client(endpoint) as client:
            for path in ("/json", "/page"):
                measure(client, site.url(path), path, tls)


def measure(client: Client, url: str, path: str, tls: ssl.SSLContext) -> None:
    direct = sample(lambda: httpx.get(url, trust_env=False, verify=tls), N, warmup=10)
    report(f"httpx.get {path} (fresh client)", direct)

    def fetch() -> None:
        result = client.call("web_fetch", {"url": url})
        assert result.ok, result.content

    report(f"web_fetch {path} via daemon", sample(fetch, N, warmup=10), direct)


if __name__ == "__main__":
    main()
