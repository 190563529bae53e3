"""Cost of journaling per call: synchronous=normal and =full against no journal, same run.

Three daemons side by side, rounds alternating between them, so that the machine's
drift hits all three alike. Each sample is one call through the client: a 600-byte
``read_file`` (a read-only batch: one write when it ends, which nobody waits for) and a
``write_file`` (side-effecting: its batch record and its result are committed before
the client hears of them). Printed as p50/p99 and the ratio to the same call with the
journal off.

    .venv/bin/python bench/bench_journal.py [calls per case]
"""

from __future__ import annotations

import contextlib
import functools
import sys
import tempfile
from pathlib import Path

from _common import report, running_daemon, sample
from toold_client import Client

ROUNDS = 5
ALLOW_WRITES = '[tools.approval]\nallowlist = ["write_file"]\n'
JOURNALS = {
    "journal off [baseline]": "[journal]\nenabled = false\n",
    "journal synchronous=normal": '[journal]\nsynchronous = "normal"\n',
    "journal synchronous=full": '[journal]\nsynchronous = "full"\n',
}


def _checked(client: Client, tool: str, args: dict[str, object]) -> None:
    result = client.call(tool, args)
    if not result.ok:
        raise SystemExit(f"{tool} failed: {result.content}")


def main(n: int = 1500) -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp) / "root"
        root.mkdir()
        (root / "f.txt").write_text("hello\n" * 100)
        clients: dict[str, Client] = {}
        for index, (name, journal) in enumerate(JOURNALS.items()):
            cfg = Path(tmp) / f"{index}.toml"
            cfg.write_text(ALLOW_WRITES + journal)
            clients[name] = stack.enter_context(Client(stack.enter_context(running_daemon(root, "--config", str(cfg)))))
        reads: dict[str, list[float]] = {name: [] for name in clients}
        writes: dict[str, list[float]] = {name: [] for name in clients}
        per_round = max(1, n // ROUNDS)
        for round_number in range(ROUNDS):
            warmup = 50 if round_number == 0 else 5
            for name, client in clients.items():
                reads[name] += sample(
                    functools.partial(_checked, client, "read_file", {"path": "f.txt"}), per_round, warmup
                )
                write = {"path": "w.txt", "content": "written\n", "overwrite": True}
                writes[name] += sample(functools.partial(_checked, client, "write_file", write), per_round // 3, 2)
    for kind, times in (("read_file", reads), ("write_file", writes)):
        print(f"# journaling cost per {kind} call, {sum(len(t) for t in times.values()) // len(times)} calls per case")
        baseline = times["journal off [baseline]"]
        for name, samples in times.items():
            report(name, samples, None if samples is baseline else baseline)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
