"""A 4 KB ``read_file`` as an MCP ``tools/call``, through ``toolctl mcp`` (the bridge to a
running daemon) and through the reference MCP filesystem server (npm
``@modelcontextprotocol/server-filesystem``, ``read_text_file``), both driven by the
official SDK's ``ClientSession`` over stdio in the same run. Also the daemon's own
client for the same read, for what the MCP layer costs.

Run: ``.venv/bin/python bench/bench_mcp.py`` (installs the npm packages on first use).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from _common import BIN, report, running_daemon, sample
from toold_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.mcp_peers import npm_bin

N = 500
WARMUP = 50
ROUNDS = 3


async def time_mcp(params: StdioServerParameters, tool: str, arguments: dict[str, Any]) -> list[float]:
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(WARMUP):
            result = await session.call_tool(tool, arguments)
            assert not result.isError, result
        times = []
        for _ in range(N):
            started = time.perf_counter()
            await session.call_tool(tool, arguments)
            times.append(time.perf_counter() - started)
        return times


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        (root / "file.txt").write_text(("x" * 63 + "\n") * 64)  # 4 KiB
        peer = StdioServerParameters(command=str(npm_bin("mcp-server-filesystem")), args=[str(root)])
        with running_daemon(root) as endpoint:
            bridge = StdioServerParameters(command=str(BIN / "toolctl"), args=["--endpoint", endpoint, "mcp"])
            ratios = []
            for round_ in range(1, ROUNDS + 1):
                print(f"round {round_}", flush=True)
                with Client(endpoint) as client:
                    direct = sample(lambda c=client: c.call("read_file", {"path": "file.txt"}), N)  # type: ignore[misc]
                report("toold Client.call read_file", direct)
                reference = anyio.run(time_mcp, peer, "read_text_file", {"path": str(root / "file.txt")})
                report("MCP server-filesystem read_text_file", reference)
                ours = anyio.run(time_mcp, bridge, "read_file", {"path": "file.txt"})
                report("MCP toolctl mcp -> toold read_file", ours, reference)
                ratios.append(statistics.median(ours) / statistics.median(reference))
            print(
                f"bridge / reference p50: median {statistics.median(ratios):.2f}x, "
                f"range {min(ratios):.2f}-{max(ratios):.2f}x over {ROUNDS} rounds"
            )


if __name__ == "__main__":
    main()
