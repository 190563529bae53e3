"""What the egress proxy costs: a 10 MB download through it against the same download
without it, and the added cost per command (``shell true``) when the proxy is on. A
download of one byte shows what a connection costs whatever it carries (the call's
question to the runner, the proxy's hop, the wait for its record); the 10 MB one adds
what the second loopback hop costs per byte.

Two daemons run side by side on the same root: one with ``[tools.network] mode = "proxy"``
(the default), one with ``mode = "host"``. A local HTTP server on 127.0.0.2 serves the
file; the proxy daemon allows that address. Rounds alternate between the daemons so
that the machine's drift hits both alike. Also shown: curl run directly by this process.

The floor for any proxy that moves bytes in user space is a bare relay: ``socat`` with
1 MiB buffers relaying TCP to the same server (no proxy protocol, no rules, no records),
fetched by the host-mode daemon's shell. What the proxy adds over host mode, less what
that relay adds, is the proxy's own cost. Skipped when ``socat`` is not installed.

    .venv/bin/python bench/bench_egress.py [rounds]
"""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _common import running_daemon
from toold_client import Client

SIZE = 10 * 1024 * 1024
PAYLOAD = b"x" * SIZE


class _File(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = PAYLOAD if self.path == "/file" else b"x"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def timed_call(client: Client, command: str) -> float:
    t0 = time.perf_counter()
    result = client.call("shell", {"command": command})
    elapsed = time.perf_counter() - t0
    if not result.ok:
        raise SystemExit(f"{command!r} failed: {result.content[:300]}")
    return elapsed


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    server = ThreadingHTTPServer(("127.0.0.2", 0), _File)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.2:{server.server_address[1]}/file"
    download = f"curl -sS -o /dev/null {url}"
    relay = _bare_relay(server.server_address[1])
    relayed = f"curl -sS -o /dev/null http://127.0.0.1:{relay[1]}/file" if relay else ""
    one_byte = f"curl -sS -o /dev/null {url.removesuffix('/file')}/byte"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        proxy_cfg, host_cfg = Path(tmp, "proxy.toml"), Path(tmp, "host.toml")
        common = '[tools.approval]\nallowlist = ["shell"]\n'
        proxy_cfg.write_text(
            common + f'[tools.network]\nallowed_domains = ["127.0.0.2"]\nallowed_networks = ["127.0.0.2/32"]\n'
            f"allowed_ports = [{server.server_address[1]}]\n"
        )
        host_cfg.write_text(common + '[tools.network]\nmode = "host"\n')
        with (
            running_daemon(root, "--config", str(proxy_cfg)) as proxied,
            running_daemon(root, "--config", str(host_cfg)) as direct,
            Client(proxied, timeout=60) as via_proxy,
            Client(direct, timeout=60) as via_host,
        ):
            for _ in range(3):
                timed_call(via_proxy, download)
                timed_call(via_host, download)
            sizes: dict[str, list[float]] = {"proxy": [], "host": [], "curl": [], "relay": []}
            trues: dict[str, list[float]] = {"proxy": [], "host": []}
            bytes_: dict[str, list[float]] = {"proxy": [], "host": []}
            for _ in range(rounds):
                sizes["curl"].append(_curl(url))
                sizes["proxy"].append(timed_call(via_proxy, download))
                sizes["host"].append(timed_call(via_host, download))
                if relayed:
                    sizes["relay"].append(timed_call(via_host, relayed))
                for _ in range(5):
                    bytes_["proxy"].append(timed_call(via_proxy, one_byte))
                    bytes_["host"].append(timed_call(via_host, one_byte))
                for _ in range(40):
                    trues["proxy"].append(timed_call(via_proxy, "true"))
                    trues["host"].append(timed_call(via_host, "true"))
    server.shutdown()
    if relay:
        relay[0].kill()
    med = {k: statistics.median(v) for k, v in sizes.items() if v}
    print(f"10 MB download, curl directly          p50 {med['curl'] * 1e3:8.1f} ms")
    print(f"10 MB download, shell, mode host       p50 {med['host'] * 1e3:8.1f} ms")
    ratios = f"ratio to host mode {med['proxy'] / med['host']:.2f}x  to curl {med['proxy'] / med['curl']:.2f}x"
    print(f"10 MB download, shell, mode proxy      p50 {med['proxy'] * 1e3:8.1f} ms   {ratios}")
    if "relay" in med:
        floor = f"ratio to host mode {med['relay'] / med['host']:.2f}x"
        print(
            f"10 MB download, shell, host, via socat p50 {med['relay'] * 1e3:8.1f} ms   {floor} (a bare relay's floor)"
        )
        own = (med["proxy"] - med["relay"]) * 1e3
        print(f"   the proxy's own cost over a bare relay: {own:+.1f} ms per 10 MB download")
    else:
        print("   (socat is not installed: no bare-relay floor; apt-get install socat)")
    p, h = statistics.median(bytes_["proxy"]), statistics.median(bytes_["host"])
    print(f"1 byte download, shell, mode host      p50 {h * 1e3:8.1f} ms")
    added = f"added {(p - h) * 1e6:+.0f} µs per connection"
    print(f"1 byte download, shell, mode proxy     p50 {p * 1e3:8.1f} ms   {added}")
    p, h = statistics.median(trues["proxy"]), statistics.median(trues["host"])
    print(f"shell true, mode host                  p50 {h * 1e6:8.1f} µs")
    print(f"shell true, mode proxy                 p50 {p * 1e6:8.1f} µs   added {(p - h) * 1e6:+.1f} µs per command")


def _bare_relay(port: int) -> tuple[subprocess.Popen[bytes], int] | None:
    """socat relaying 127.0.0.1:<free port> to the server, a process per connection."""
    if shutil.which("socat") is None:
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = probe.getsockname()[1]
    command = [
        "socat",
        "-b",
        str(1 << 20),
        f"TCP-LISTEN:{listen},bind=127.0.0.1,fork,reuseaddr",
        f"TCP:127.0.0.2:{port}",
    ]
    process = subprocess.Popen(command)
    for _ in range(100):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", listen)) == 0:
                return process, listen
        time.sleep(0.02)
    process.kill()
    return None


def _curl(url: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["curl", "-sS", "-o", "/dev/null", url], check=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
