"""Class Q, the daemon's memory: clients that submit batches and never read the answers.

Each such connection used to cost the daemon what libzmq would queue for it (64 frames
of any size: 64 outcomes of 800 KB), plus its own backlog, and being cut off for not
reading did not stop it: its next submission started a new session, and the journal's
queue (bounded at 5,000 writes, not in bytes) took every result. Ten such connections
took the protocol process from 41 MB to 2.5 GB in a minute.

Now libzmq is handed only a few megabytes for a connection not seen reading, one uid's
connections share ``max_uid_backlog_bytes``, the journal's queue is bounded in bytes
too, and batches waiting for the journal count against their uid whatever became of
their sessions."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
import zmq

import toold_protocol as p
from tests.conftest import reachable_daemon
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")

MB = 1024 * 1024
CONFIG = f"""
[daemon]
max_peer_backlog_bytes = {MB}
max_uid_backlog_bytes = {4 * MB}
finished_batches_kept_bytes = {4 * MB}
max_running_batches_per_uid = 8
"""
CONNECTIONS = 8
SECONDS = 6.0


def test_connections_that_submit_and_never_read_leave_the_daemon_its_memory(tmp_path: Path) -> None:
    """Attack: another uid opens 8 connections and submits a batch of eight 100 KB reads on
    each every 20 ms for 6 s, reading nothing. The daemon grows by less than 100 MB (23 MB
    measured; 232 MB before, and growing with the attack's length); this test's uid is
    served all along; the attacker, reading again, finds its stream cut short by a notice."""
    with reachable_daemon(tmp_path, config=CONFIG) as daemon:
        (daemon.root / "big.txt").write_text(("y" * 99 + "\n") * 1000)  # 8 reads: 800 KB
        os.chmod(daemon.root / "big.txt", 0o644)
        protocol = psutil.Process(daemon.proc.pid)
        with daemon.client(timeout=30) as victim:
            assert victim.call("read_file", {"path": "big.txt"}).ok  # the worker is up: not measured
            before = protocol.memory_info().rss
            attacker = OtherUser(lambda: _attack(daemon.endpoint))
            try:
                slowest = 0.0
                while attacker.alive() and (line := attacker.line()).startswith("flooding"):
                    started = time.monotonic()
                    assert victim.call("read_file", {"path": "big.txt"}).ok
                    slowest = max(slowest, time.monotonic() - started)
                submitted = int(line.split()[1])
                grown = protocol.memory_info().rss - before
                waiting = victim.stats().holding["waiting_for_clients_bytes"]  # root sees every uid's
                notices = attacker.line().split()
            finally:
                attacker.kill()
        assert submitted > 300
        assert grown < 100 * MB, f"the daemon grew by {grown // MB} MB for {CONNECTIONS} clients that never read"
        assert slowest < 2.5, f"a read took {slowest:.1f} s during the attack"
        assert "BACKLOG_OVERFLOW" in notices
        # what the attacker's connections hold is within its uid's budget (and a frame)
        assert 0 < waiting <= 5 * MB, waiting


def _attack(endpoint: str) -> None:
    """In the other uid's process: flood, say how many batches went, then read what came
    back on one connection and say which errors were among it."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stalled = [_stalled_client(ctx, endpoint) for _ in range(CONNECTIONS)]
    sent = _flood(stalled)
    print(f"submitted {sent}")
    codes = [m.code for m in _read_what_came(stalled[0]) if isinstance(m, p.Error)]
    print(" ".join(codes) or "none")
    ctx.destroy(linger=0)


def _stalled_client(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    client.rcvhwm = 1  # one frame in its own queue, then nothing more is taken from the socket
    client.setsockopt(zmq.RCVBUF, 4096)
    client.connect(endpoint)
    return client


def _flood(clients: list[zmq.Socket[bytes]]) -> int:
    """Each client submits a batch of eight 100 KB reads every 20 ms for SECONDS; a line
    every round tells the test to read meanwhile."""
    sent = 0
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        for client in clients:
            calls = [p.ToolCall(call_id=f"c{k}", name="read_file", arguments={"path": "big.txt"}) for k in range(8)]
            client.send(p.encode(p.SubmitBatch(id=sent, calls=calls, events="results")))
            sent += 1
        print("flooding")
        time.sleep(0.02)
    time.sleep(1.0)  # what was submitted last has run
    return sent


def _read_what_came(client: zmq.Socket[bytes]) -> list[p.DaemonMessage]:
    messages = []
    while client.poll(1000):
        messages.append(p.decode_daemon_message(client.recv()))
    return messages
