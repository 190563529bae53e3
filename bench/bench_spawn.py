"""Cost of an isolated child: a no-op Python tool and ``shell true``, against a bare fork
and ``subprocess.run(["sh", "-c", "true"])`` measured in the same run.

The isolated figures go through the real spawner and ``SpawnRunner`` (confinement,
channel pipe, outcome, group kill and sweep), without the daemon's protocol; the last
line adds the protocol: ``shell true`` through a running daemon and the client.
Commands go through the zygote of their kind (warmed up first), the Python tool through
a freshly forked and confined child. The figures that the targets are about are the
per-round ratios: each round times its own baselines just before its isolated calls.

With ``--against DIR`` (a checkout of another commit, ``git worktree add /tmp/base
COMMIT``) a journaled daemon of that tree runs beside this tree's two and takes its turn
in every round: its ratio to ``subprocess.run`` and, round by round, this tree's p50
over its own. Compare the trees by that last figure: with three daemons up, every
daemon's ratio to ``subprocess.run`` reads higher than with two (3.0x against 2.7x
here for the journaled one).

    .venv/bin/python bench/bench_spawn.py [n] [--against DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from _common import report, running_daemon, sample, tree_environment
from toold_client import Client
from toold_daemon.config import Config
from toold_daemon.config.loading import parse
from toold_daemon.isolation.probe import Probe, ProbeArgs
from toold_daemon.isolation.runner import SpawnRunner
from toold_daemon.isolation.spawner import start
from toold_daemon.sandbox import build_sandbox
from toold_daemon.tools import ToolContext
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.shell import ShellArgs
from toold_protocol import Identity


def bare_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


ROUNDS = 5


@dataclass
class Rounds:
    """Samples pooled over all rounds, and each round's p50 ratio to its own baselines."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in ("fork", "py", "sub", "sh")})
    ratios: dict[str, list[float]] = field(default_factory=lambda: {"py": [], "sh": []})

    def add(self, round_: dict[str, list[float]]) -> None:
        for name, times in round_.items():
            self.samples[name] += times
        self.ratios["py"].append(statistics.median(round_["py"]) / statistics.median(round_["fork"]))
        self.ratios["sh"].append(statistics.median(round_["sh"]) / statistics.median(round_["sub"]))


async def isolated(runner: SpawnRunner, config: Config, root: Path, n: int) -> Rounds:
    """``ROUNDS`` rounds, each a block of baselines (bare forks, ``subprocess.run`` from
    this process, as big as the spawner) then a block of isolated calls: this VM's speed
    drifts by tens of percent within a minute, so each round is compared with itself."""
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
    rounds = Rounds()
    per_round = max(1, n // ROUNDS)
    for _ in range(ROUNDS):
        await trio.sleep(0.05)  # the last call's cleanup runs behind it: let it finish first
        this = {
            "fork": sample(bare_fork, per_round, warmup=5),
            "sub": sample(lambda: subprocess.run(["sh", "-c", "true"], check=True), per_round, warmup=5),
        }
        this["py"] = [await timed(probe, ProbeArgs()) for _ in range(per_round)]
        this["sh"] = [await timed(shell, ShellArgs(command="true")) for _ in range(per_round)]
        rounds.add(this)
    return rounds


def spread(ratios: list[float]) -> str:
    return (
        f"per-round p50 ratio: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
    )


#: The daemons ``shell true`` goes through: (journaled?, another checkout or None for this one).
Daemon = tuple[bool, Path | None]


def _through_daemons(
    tmp: Path, root: Path, n: int, against: Path | None = None
) -> tuple[dict[Daemon, list[float]], list[float], list[float]]:
    """``shell true`` through a daemon without a journal and one with (and, given
    ``against``, a journaled one of that checkout), and ``subprocess.run`` beside them:
    the daemons run at once and all alternate in rounds, so that the machine's drift hits
    them alike (measured one after the other, the journal's cost read four times what it
    is). Also each round's p50 of this tree's journaled daemon over the other's."""
    daemons: list[Daemon] = [(False, None), (True, None)] + ([(True, against)] if against else [])
    through_daemon: dict[Daemon, list[float]] = {daemon: [] for daemon in daemons}
    sub_beside: list[float] = []
    this_over_against: list[float] = []
    with contextlib.ExitStack() as stack:
        clients = {}
        for journaled, tree in daemons:
            cfg = tmp / f"journal-{journaled}.toml"
            cfg.write_text(f'[tools.approval]\nallowlist = ["shell"]\n[journal]\nenabled = {str(journaled).lower()}\n')
            env = tree_environment(tree) if tree is not None else None
            endpoint = stack.enter_context(running_daemon(root, "--config", str(cfg), env=env))
            clients[(journaled, tree)] = stack.enter_context(Client(endpoint))
        per_round = max(1, n // ROUNDS)
        for round_number in range(ROUNDS):
            warmup = 20 if round_number == 0 else 2
            sub_beside += sample(lambda: subprocess.run(["sh", "-c", "true"], check=True), per_round, warmup=warmup)
            this_round = {}
            for daemon, client in clients.items():
                call = functools.partial(client.call, "shell", {"command": "true"})
                this_round[daemon] = sample(call, per_round, warmup=warmup)
                through_daemon[daemon] += this_round[daemon]
            if against is not None:
                this_over_against.append(
                    statistics.median(this_round[(True, None)]) / statistics.median(this_round[(True, against)])
                )
    return through_daemon, sub_beside, this_over_against


def main(n: int = 300, against: Path | None = None) -> None:
    config = parse('[tools.approval]\nallowlist = ["shell"]\n')
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        spawner_pid, control = start([*builtin_tools(), Probe()])

        async def measure() -> Rounds:
            runner = SpawnRunner(spawner_pid, control, config)
            try:
                async with trio.open_nursery() as nursery:  # as in the daemon: cleanup runs behind
                    runner.bind_nursery(nursery)
                    measured = await isolated(runner, config, root, n)
                    nursery.cancel_scope.cancel()  # the runner's links (egress) serve until cancelled
                return measured
            finally:
                runner.close()

        rounds = trio.run(measure)
        through_daemon, sub_beside, this_over_against = _through_daemons(Path(tmp), root, n, against)
    fork, python_child, sub, shell_true = (rounds.samples[k] for k in ("fork", "py", "sub", "sh"))
    print(f"# isolated child cost, n={n} in {ROUNDS} rounds (baselines, then isolated calls)")
    report("bare fork + exit + wait [baseline A]", fork)
    report("isolated no-op Python tool vs A", python_child, fork)
    print(f"{'':44} {spread(rounds.ratios['py'])}")
    report("subprocess.run sh -c true [baseline B]", sub)
    report("isolated shell true vs B", shell_true, sub)
    print(f"{'':44} {spread(rounds.ratios['sh'])}")
    report("shell true via daemon+client, no journal vs B'", through_daemon[(False, None)], sub_beside)
    report("shell true via daemon+client, journaled vs B'", through_daemon[(True, None)], sub_beside)
    if against is not None:
        report(f"  the same through {against} vs B'", through_daemon[(True, against)], sub_beside)
        print(f"{'':44} this tree / {against}: {spread(this_over_against)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("n", type=int, nargs="?", default=300)
    parser.add_argument("--against", type=Path, help="another checkout: its journaled daemon takes its turn too")
    args = parser.parse_args()
    main(args.n, args.against.resolve() if args.against else None)
