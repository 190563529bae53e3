"""CPU time per call, by process: a 4 KB read_file through the client vs a raw ZeroMQ echo.

Wall-clock figures on a shared 2-vCPU machine move by ±20% between runs; the CPU time
each process spends per call (read from ``/proc``) moves much less, so it is the figure
to compare when a change touches the hot path. For the read: the protocol process
(including its short spin while it waits for the worker), the tool workers and the
client; for the echo, its server and its client. Several rounds; median reported.

With ``--against DIR`` (a checkout of another commit, ``git worktree add /tmp/base
COMMIT``) a daemon of that tree runs beside this tree's and the two are called in turn,
call by call, so that the machine's drift (±10 % between runs here) lands on both
alike; each round gives the ratio of their protocol processes' CPU per call. ``--call
shell`` measures ``shell true`` instead of the read, ``--call write`` a 4 KB ``write_file``.

    .venv/bin/python bench/bench_cpu.py [n] [rounds] [--against DIR [--call read|shell|write]]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from _common import running_daemon, tree_environment
from bench_roundtrip import echo_pair, four_kb_root
from toold_client import Client
from toold_protocol import Ping, decode_daemon_message, encode


def cpu_seconds(process: psutil.Process) -> float:
    """The process's CPU time and that of its children it has reaped: a zygote that wore
    out and ended within a round is then still counted, in its reaper's figure."""
    try:
        times = process.cpu_times()
    except psutil.Error:  # a worker retired meanwhile, not reaped by a process counted here
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def cpu_snapshot(processes: list[psutil.Process]) -> dict[psutil.Process, float]:
    return {process: cpu_seconds(process) for process in processes}


def cpu_since(before: dict[psutil.Process, float]) -> float:
    """CPU seconds the processes of ``before`` used since it was taken, counting those
    still there. One that ended meanwhile is left out, not subtracted: a zygote that
    wore out is reaped by the spawner, which ignores SIGCHLD, so its time reaches no
    one's figure, and subtracting what it had used before made a group's CPU negative."""
    total = 0.0
    for process, then in before.items():
        try:
            process.cpu_times()  # still there (cpu_seconds would say 0.0 for one gone)
        except psutil.Error:
            continue
        total += cpu_seconds(process) - then
    return total


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def per_call(work: Callable[[], object], n: int, processes: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """µs of CPU per call of ``work``, for this process ("client") and each named group."""
    before = {name: cpu_snapshot(group) for name, group in processes.items()}
    mine, started = own_cpu_seconds(), time.perf_counter()
    for _ in range(n):
        work()
    figures = {"wall": (time.perf_counter() - started) / n * 1e6, "client": (own_cpu_seconds() - mine) / n * 1e6}
    for name in processes:
        figures[name] = cpu_since(before[name]) / n * 1e6
    return figures


def serving_processes(endpoint: str) -> dict[str, list[psutil.Process]]:
    """The daemon serving ``endpoint``: its protocol process, and its spawner with every
    process below it ("workers": tool workers, command zygotes and their egress
    processes, the commands themselves while they run). A process started within a round
    is missed: list them again each round."""
    serving = [p for p in psutil.process_iter(["cmdline", "ppid"]) if endpoint in (p.info["cmdline"] or [])]
    # The protocol process started the others (a command's egress process has threads
    # too, so counting threads would take it for the protocol process).
    pids = {p.pid for p in serving}
    protocol = [p for p in serving if p.info["ppid"] not in pids]
    below: dict[int, psutil.Process] = {}
    for spawner in (p for p in serving if p not in protocol):
        below[spawner.pid] = spawner
        with contextlib.suppress(psutil.Error):
            below.update((child.pid, child) for child in spawner.children(recursive=True))
    # Keyed by pid: a worker is forked from the spawner and so carries the daemon's command
    # line too; listed both as served and as a child, it would be counted twice.
    return {"protocol": protocol, "workers": list(below.values())}


#: What ``--against`` measures: a 4 KB read, ``shell true`` (a command through a zygote),
#: or a 4 KB ``write_file`` over an existing file (journaled before it runs, its
#: pre-image taken for undo).
CALLS: dict[str, tuple[str, dict[str, object]]] = {
    "read": ("read_file", {"path": "four_kb.txt"}),
    "shell": ("shell", {"command": "true"}),
    "write": ("write_file", {"path": "written.txt", "content": "y" * 4095 + "\n", "overwrite": True}),
}


def interleaved(trees: dict[str, dict[str, str] | None], n: int, rounds: int, call: str = "read") -> None:
    """Each tree's daemon called in turn, call by call; CPU per call of each, by round."""
    tool, arguments = CALLS[call]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = four_kb_root(Path(tmp))
        config = Path(tmp, "toold.toml")
        config.write_text('[tools.approval]\nallowlist = ["shell", "write_file"]\n')  # run unasked
        clients = {
            name: stack.enter_context(
                Client(stack.enter_context(running_daemon(root, "--config", str(config), env=env)))
            )
            for name, env in trees.items()
        }
        endpoints = {name: client.endpoint for name, client in clients.items()}
        for _ in range(300):
            for client in clients.values():
                assert client.call(tool, arguments).ok
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        waits: dict[str, list[float]] = {name: [] for name in trees}  # each call's wall time
        clock = time.perf_counter
        for _ in range(rounds):
            groups = {name: serving_processes(endpoint) for name, endpoint in endpoints.items()}
            before = {name: {g: cpu_snapshot(ps) for g, ps in group.items()} for name, group in groups.items()}
            for _ in range(n):
                for name, client in clients.items():
                    started = clock()
                    client.call(tool, arguments)
                    waits[name].append(clock() - started)
            for name, group in groups.items():
                figures[name].append({g: cpu_since(before[name][g]) / n * 1e6 for g in group})
    print(f"# CPU µs per {tool} call, n={n} per tree and round, {rounds} rounds, calls alternating between the trees")
    for name, rows in figures.items():
        protocol = statistics.median(r["protocol"] for r in rows)
        workers = statistics.median(r["workers"] for r in rows)
        wall = statistics.median(waits[name]) * 1e6
        print(f"{name:<24} protocol {protocol:7.1f}  workers {workers:7.1f}  call p50 {wall:7.1f} µs (wall)")
    ours, *others = figures
    for other in others:
        for what, of in (("protocol CPU", ("protocol",)), ("protocol + workers CPU", ("protocol", "workers"))):
            pairs = zip(figures[ours], figures[other], strict=True)
            ratios = [sum(a[g] for g in of) / sum(b[g] for g in of) for a, b in pairs]
            spread = f"range {min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{what}, {ours} / {other}: {statistics.median(ratios):.3f}x ({spread})")
        print(f"call p50, {ours} / {other}: {statistics.median(waits[ours]) / statistics.median(waits[other]):.3f}x")


def main(n: int = 3000, rounds: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = four_kb_root(Path(tmp))
        server, dealer = echo_pair(tmp)

        def echo() -> None:
            dealer.send(encode(Ping(id=1)))
            decode_daemon_message(dealer.recv())

        rows: dict[str, list[dict[str, float]]] = {"echo": [], "read": []}
        with running_daemon(root) as endpoint, Client(endpoint) as client:

            def read() -> None:
                assert client.call("read_file", {"path": "four_kb.txt"}).ok

            for _ in range(300):
                read()
                echo()
            daemon = serving_processes(client.endpoint)
            for _ in range(rounds):
                rows["echo"].append(per_call(echo, n, {"server": [psutil.Process(server.pid)]}))
                rows["read"].append(per_call(read, n, daemon))
        server.terminate()
    print(f"# CPU µs per call, n={n} per case, {rounds} rounds, medians ({sys.platform})")
    for case, samples in rows.items():
        names = list(samples[0])
        line = "  ".join(f"{name} {statistics.median(s[name] for s in samples):7.1f}" for name in names)
        print(f"{case:<5} {line}")
    echo_total = statistics.median(s["server"] + s["client"] for s in rows["echo"])
    read_total = statistics.median(s["protocol"] + s["workers"] + s["client"] for s in rows["read"])
    print(f"read CPU per call, all processes: {read_total:.0f} µs = {read_total / echo_total:.1f}x the echo's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("n", type=int, nargs="?", default=3000)
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    parser.add_argument("--against", type=Path, help="another checkout, called call by call beside this tree")
    parser.add_argument("--call", choices=sorted(CALLS), default="read", help="what --against measures")
    args = parser.parse_args()
    if args.against:
        trees = {"this tree": None, str(args.against): tree_environment(args.against.resolve())}
        interleaved(trees, args.n, args.rounds, args.call)
    else:
        main(args.n, args.rounds)
