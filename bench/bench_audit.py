"""What the audit trail costs per call: a 4 KB read_file round trip with the audit off,
sent to a journal (a datagram socket read by a thread here, as journald would), and
written as lines to a file. Three daemons side by side, rounds alternating between them;
the ratio is against the daemon with the audit off, measured in the same round.
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _common import report, running_daemon, sample
from bench_roundtrip import four_kb_root
from toold_client import Client


def _drain(path: str, count: Any) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    while True:
        sock.recv(1 << 16)
        with count.get_lock():
            count.value += 1


def journal_reader(path: Path) -> tuple[multiprocessing.Process, Any]:
    """A bound datagram socket drained by a process of its own, as journald would (in
    this process its thread would contend with the client for the interpreter)."""
    count = multiprocessing.Value("q", 0)
    reader = multiprocessing.Process(target=_drain, args=(str(path), count), daemon=True)
    reader.start()
    while not path.exists():
        time.sleep(0.01)
    return reader, count


def main(n: int = 2000, rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = four_kb_root(Path(tmp))
        journal, received = journal_reader(Path(tmp, "journal.sock"))
        configs = {
            "audit off [baseline]": '[daemon]\naudit = "off"\n',
            "audit to the journal": f'[daemon]\naudit = "journal"\naudit_journal_socket = "{tmp}/journal.sock"\n',
            "audit as lines": '[daemon]\naudit = "lines"\n',
        }
        clients = {}
        for name, text in configs.items():
            config = Path(tmp, f"{len(clients)}.toml")
            config.write_text(text)
            endpoint = stack.enter_context(running_daemon(root, "--config", str(config)))
            clients[name] = stack.enter_context(Client(endpoint))
        print(f"# audit trail cost, read_file 4 KB, n={n} per case, {rounds} rounds (python {sys.version.split()[0]})")
        ratios: dict[str, list[float]] = {name: [] for name in clients}
        for round_ in range(1, rounds + 1):
            print(f"round {round_}")
            times = {}
            for name, client in clients.items():

                def read(client: Client = client) -> None:
                    assert client.call("read_file", {"path": "four_kb.txt"}).ok

                times[name] = sample(read, n)
            base = times["audit off [baseline]"]
            for name, values in times.items():
                report(name, values, None if values is base else base)
                ratios[name].append(statistics.median(values) / statistics.median(base))
        for name, values in ratios.items():
            print(
                f"{name}: p50 ratio median {statistics.median(values):.3f} (range {min(values):.3f}-{max(values):.3f})"
            )
        print(f"journal records received: {received.value}")
        journal.terminate()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
