"""Cost of an isolated child: a no-op Python tool and ``shell true``, against a bare fork
and ``subprocess.run(["sh", "-c", "true"])`` measured in the same run.

The isolated figures go through the real spawner and ``SpawnRunner`` (confinement,
channel pipe, outcome, group kill and sweep), without the daemon's protocol; the last
line adds the protocol: ``shell true`` through a running daemon and the client.
Commands go through the zygote of their kind (warmed up first), the Python tool through
a freshly forked and confined child. This VM's speed drifts by tens of percent over a
minute, so the baselines are sampled half before and half after the isolated runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from _common import report, running_daemon, sample
from toold_client import Client
from toold_daemon.config import Config, parse
from toold_daemon.isolation.probe import Probe, ProbeArgs
from toold_daemon.isolation.runner import SpawnRunner
from toold_daemon.isolation.spawner import start
from toold_daemon.sandbox import build_sandbox
from toold_daemon.tools import ToolContext, builtin_tools
from toold_daemon.tools.shell import ShellArgs
from toold_protocol import Identity


def bare_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def baselines(n: int) -> tuple[list[float], list[float]]:
    """Bare forks and ``subprocess.run(["sh", "-c", "true"])`` from this process (as big
    as the spawner), each in a block of its own: half before the isolated runs, half after."""
    fork = sample(bare_fork, n, warmup=20)
    sub = sample(lambda: subprocess.run(["sh", "-c", "true"], check=True), n, warmup=20)
    return fork, sub


async def isolated(runner: SpawnRunner, config: Config, root: Path, n: int) -> tuple[list[float], list[float]]:
    me = Identity(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())
    sandbox = build_sandbox(config, [root])
    shell = next(t for t in builtin_tools() if t.name == "shell")
    probe = Probe()

    async def timed(tool: object, args: object) -> float:
        ctx = ToolContext(call_id="b", sandbox=sandbox, config=config)
        t0 = time.perf_counter()
        await runner.run(tool, args, ctx, me)  # type: ignore[arg-type]
        return time.perf_counter() - t0

    for _ in range(20):
        await timed(probe, ProbeArgs())
        await timed(shell, ShellArgs(command="true"))
    python_child = [await timed(probe, ProbeArgs()) for _ in range(n)]
    shell_true = [await timed(shell, ShellArgs(command="true")) for _ in range(n)]
    return python_child, shell_true


def main(n: int = 300) -> None:
    config = parse('[tools.approval]\nallowlist = ["shell"]\n')
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        spawner_pid, control = start([*builtin_tools(), Probe()])
        fork, sub = baselines(n // 2)

        async def measure() -> tuple[list[float], list[float]]:
            runner = SpawnRunner(spawner_pid, control, config)
            try:
                async with trio.open_nursery() as nursery:  # as in the daemon: cleanup runs behind
                    runner.bind_nursery(nursery)
                    return await isolated(runner, config, root, n)
            finally:
                runner.close()

        python_child, shell_true = trio.run(measure)
        fork_after, sub_after = baselines(n - n // 2)  # before and after: drift shows in both
        fork += fork_after
        sub += sub_after
        cfg = Path(tmp) / "c.toml"
        cfg.write_text('[tools.approval]\nallowlist = ["shell"]\n[journal]\nenabled = false\n')
        with running_daemon(root, "--config", str(cfg)) as endpoint, Client(endpoint) as client:
            through_daemon = sample(lambda: client.call("shell", {"command": "true"}), n, warmup=20)
    print(f"# isolated child cost, n={n}")
    report("bare fork + exit + wait [baseline A]", fork)
    report("isolated no-op Python tool vs A", python_child, fork)
    report("subprocess.run sh -c true [baseline B]", sub)
    report("isolated shell true vs B", shell_true, sub)
    report("shell true via daemon+client vs B", through_daemon, sub)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
