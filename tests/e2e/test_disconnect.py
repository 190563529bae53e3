"""A client that vanishes or stops reading: its session ends, the daemon keeps serving.

libzmq reports no disconnects, so the daemon watches each peer's socket itself; these
tests kill real client processes and stall real sockets.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import psutil
import zmq

import toold_protocol as p
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_isolation import alive_with

ALLOW_SHELL = """
[tools.approval]
allowlist = ["shell"]
"""

# A client in its own process: submits one command, prints the batch id, then waits to be killed.
CLIENT = """
import sys, msgspec, time
import toold_protocol as p
from toold_client import Client
from toold_client._requests import Request
client = Client(sys.argv[1])
args = msgspec.Raw(p.encode_value({"command": sys.argv[2]}))
call = p.ToolCall(call_id="c", name="shell", arguments=args)
accepted = client._request(Request(p.SubmitBatch, {"calls": [call]}))
print(accepted.batch_id, flush=True)
time.sleep(600)
"""


def submit_from_a_doomed_client(daemon: DaemonProcess, command: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, daemon.endpoint, command], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    batch_id = proc.stdout.readline().strip()
    assert batch_id, "the client process did not get its batch accepted"
    return proc, batch_id


def wait_settled(daemon: DaemonProcess, batch_id: str, timeout: float = 10.0) -> p.BatchStatus:
    with daemon.client(timeout=10) as observer:
        deadline = time.monotonic() + timeout
        while True:
            status = observer.get_batch(batch_id)
            if status.state in ("finished", "cancelled") or time.monotonic() > deadline:
                return status
            time.sleep(0.05)


def test_a_killed_client_has_its_running_command_killed(tmp_path: Path, root: Path) -> None:
    daemon = start_daemon(tmp_path, root, config=ALLOW_SHELL)
    try:
        marker = f"35{uuid.uuid4().int % 10**6:06d}"
        proc, batch_id = submit_from_a_doomed_client(daemon, f"echo begun; sleep {marker}")
        deadline = time.monotonic() + 15
        while not alive_with(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alive_with(marker), "the command never started"
        time.sleep(0.3)  # "begun" was printed before sleep started, but may still be on its way
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        status = wait_settled(daemon, batch_id)
        noticed = time.monotonic() - killed_at
        assert status.state == "cancelled"
        [result] = status.results
        assert result.error is not None and result.error.type == "Cancelled"
        assert "disconnected" in result.error.message
        assert "begun" in result.content  # the partial output is kept
        assert noticed < 5.0  # checked every 0.2 s; the margin is for a loaded CI machine
        time.sleep(0.2)
        assert alive_with(marker) == []
        with daemon.client() as other:  # and everyone else is still served
            assert other.ping() >= 0
    finally:
        daemon.stop()


def test_finish_policy_lets_the_batch_run_to_its_end(tmp_path: Path, root: Path) -> None:
    config = ALLOW_SHELL + '\n[daemon]\non_client_disconnect = "finish"\n'
    daemon = start_daemon(tmp_path, root, config=config)
    try:
        proc, batch_id = submit_from_a_doomed_client(daemon, "sleep 1; echo done")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        status = wait_settled(daemon, batch_id)
        assert status.state == "finished"
        assert status.results[0].ok and status.results[0].content.startswith("done\n")
    finally:
        daemon.stop()


def test_a_client_that_stops_reading_is_cut_off_and_memory_stays_bounded(tmp_path: Path, root: Path) -> None:
    config = ALLOW_SHELL + "\n[tools]\nmax_tool_calls_per_batch = 64\n[daemon]\nmax_peer_backlog_bytes = 1048576\n"
    daemon = start_daemon(tmp_path, root, config=config)
    ctx = zmq.Context()
    stalled = ctx.socket(zmq.DEALER)
    stalled.linger = 0
    stalled.rcvhwm = 1
    stalled.setsockopt(zmq.RCVBUF, 4096)
    stalled.connect(daemon.endpoint)
    try:
        rss_before = psutil.Process(daemon.proc.pid).memory_info().rss
        megabyte = "yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 1000000"
        calls = [
            p.ToolCall(call_id=f"c{i}", name="shell", arguments=msgspec.Raw(p.encode_value({"command": megabyte})))
            for i in range(40)
        ]
        stalled.send(p.encode(p.SubmitBatch(id=1, calls=calls, batch_id="stalled-batch")))
        assert stalled.poll(5000)
        assert isinstance(p.decode_daemon_message(stalled.recv()), p.BatchAccepted)  # then it stops reading
        status = wait_settled(daemon, "stalled-batch", timeout=90)
        rss_after = psutil.Process(daemon.proc.pid).memory_info().rss
        assert status.state == "cancelled"
        assert any(r.error is not None and "stopped reading" in r.error.message for r in status.results)
        assert rss_after - rss_before < 48 << 20
        # Reading again, the client finds its stream cut short by one typed notice.
        frames = []
        while stalled.poll(2000):
            frames.append(p.decode_daemon_message(stalled.recv()))
        errors = [f for f in frames if isinstance(f, p.Error)]
        assert [e.code for e in errors] == ["BACKLOG_OVERFLOW"]
        assert frames[-1] is errors[0]
        with daemon.client() as other:
            assert other.ping() >= 0
    finally:
        stalled.close()
        ctx.term()
        daemon.stop()
