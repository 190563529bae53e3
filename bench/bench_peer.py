"""The same 4 KB read through toold and through the tool a user would otherwise pick: the
reference MCP filesystem server (npm ``@modelcontextprotocol/server-filesystem``,
``read_text_file``), driven over stdio by the smallest client that speaks its protocol
(newline-delimited JSON-RPC, blocking reads), so the peer pays nothing for our harness.
toold is driven by its own client (``Client.call``). Two ways, each round: back to back
(a burst: each side's calls in a block, its processes still awake from the last call)
and alternating (call by call, so each side's processes have slept while the other's
ran, as between an agent's calls; the machine's drift then hits both alike). Several
rounds in the same run; the ratio toold / peer of p50 per round and way, then its
median and range. Goal: <= 0.8.

Run: ``.venv/bin/python bench/bench_peer.py [calls-per-round]`` (installs the npm
package on first use).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import report, running_daemon, sample, sample_interleaved
from toold_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.mcp_peers import npm_bin

ROUNDS = 5


class StdioPeer:
    """An MCP server as a child process, spoken to one request at a time."""

    def __init__(self, argv: list[str]) -> None:
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._next_id = 0
        self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
        )
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")
        self._proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        assert self._proc.stdout is not None
        while True:
            message = json.loads(self._proc.stdout.readline())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(message["error"])
                result: dict[str, Any] = message["result"]
                return result

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)


def main(n: int = 1000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        (root / "file.txt").write_text(("x" * 63 + "\n") * 64)  # 4 KiB
        target = str(root / "file.txt")
        peer = StdioPeer([str(npm_bin("mcp-server-filesystem")), str(root)])
        ratios: dict[str, list[float]] = {"back to back": [], "alternating": []}
        try:
            with running_daemon(root) as endpoint, Client(endpoint) as client:

                def toold_read() -> None:
                    result = client.call("read_file", {"path": "file.txt"})
                    assert result.ok and len(result.content) == 4096

                def peer_read() -> None:
                    result = peer.request("tools/call", {"name": "read_text_file", "arguments": {"path": target}})
                    assert not result.get("isError") and len(result["content"][0]["text"]) == 4096

                print(f"# 4 KB read, toold vs MCP server-filesystem, n={n} per round and way, {ROUNDS} rounds")
                for round_ in range(1, ROUNDS + 1):
                    print(f"round {round_}")
                    theirs = sample(peer_read, n)
                    ours = sample(toold_read, n)
                    report("back to back: MCP server-filesystem [baseline]", theirs)
                    report("back to back: toold read_file", ours, theirs)
                    ratios["back to back"].append(statistics.median(ours) / statistics.median(theirs))
                    times = sample_interleaved({"peer": peer_read, "toold": toold_read}, n, warmup=50)
                    report("alternating: MCP server-filesystem [baseline]", times["peer"])
                    report("alternating: toold read_file", times["toold"], times["peer"])
                    ratios["alternating"].append(statistics.median(times["toold"]) / statistics.median(times["peer"]))
        finally:
            peer.close()
        for way, values in ratios.items():
            print(
                f"toold / peer p50, {way}: median {statistics.median(values):.2f}x, "
                f"range {min(values):.2f}-{max(values):.2f}x over {ROUNDS} rounds (goal <= 0.80x)"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
