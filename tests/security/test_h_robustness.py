"""Class H: robustness bugs an attacker could lean on."""

from __future__ import annotations

import concurrent.futures
import random
import time
from pathlib import Path

import msgspec
import zmq

import toold_protocol as p
from tests.conftest import DaemonProcess
from tests.e2e.test_daemon import big_tree
from toold_client import APPROVE_ALL
from toold_protocol import Error, decode_daemon_message


def test_delete_file_on_a_symlink_deletes_the_link_never_its_target(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Attack: ask to delete a symlink that points at a file the agent should keep (inside
    the root or outside it)."""
    inside = daemon.root / "keep.txt"
    inside.write_text("keep")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep too")
    (daemon.root / "link-in").symlink_to(inside)
    (daemon.root / "link-out").symlink_to(outside)
    (daemon.root / "dir-link").symlink_to(daemon.root)
    with daemon.client(timeout=30) as c:
        for name in ("link-in", "link-out", "dir-link"):
            c.call("delete_file", {"path": name}, on_confirm=lambda request: APPROVE_ALL)
    assert inside.read_text() == "keep" and outside.read_text() == "keep too"
    assert not (daemon.root / "link-in").is_symlink()
    assert not (daemon.root / "dir-link").is_symlink()


def test_a_deeply_nested_frame_gets_an_error_reply(daemon: DaemonProcess) -> None:
    """Attack: a frame nested 100,000 levels deep, to blow the decoder's stack (and fill
    the log with a traceback per frame)."""
    nested = b"\x91" * 100_000 + b"\xc0"
    frame = msgspec.msgpack.encode({"type": "ping", "id": 7, "padding": msgspec.Raw(nested)})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(daemon.endpoint)
        for _ in range(3):
            sock.send(frame)
            assert sock.poll(10_000), "no reply"
            reply = decode_daemon_message(sock.recv())
            assert isinstance(reply, Error) and "nested too deeply" in reply.message
    finally:
        sock.close()
        ctx.term()
    assert "Traceback" not in daemon.log.read_text() and "RecursionError" not in daemon.log.read_text()
    with daemon.client(timeout=10) as c:
        c.ping()


def test_batches_cancelled_while_their_workers_start_leave_the_daemon_serving(daemon: DaemonProcess) -> None:
    """Cancels landing at any point of a worker's start (the spawner's reply half read,
    not read, the worker announcing itself) must leave every later call working."""
    big_tree(daemon.root, 1500)
    (daemon.root / "a.txt").write_text("A")
    grep = msgspec.Raw(p.encode_value({"pattern": "needle"}))
    ctx = zmq.Context()
    storm = ctx.socket(zmq.DEALER)
    storm.linger = 0
    storm.connect(daemon.endpoint)
    try:
        for round_ in range(40):
            for i in range(6):  # more than the idle workers: some must be started
                calls = [p.ToolCall(call_id="c", name="grep", arguments=grep)]
                storm.send(p.encode(p.SubmitBatch(id=round_ * 100 + i, calls=calls, events="all")))
            accepted = []
            deadline = time.monotonic() + 10
            while len(accepted) < 6 and time.monotonic() < deadline:
                if storm.poll(100):
                    message = p.decode_daemon_message(storm.recv())
                    if isinstance(message, p.BatchAccepted):
                        accepted.append(message.batch_id)
                        storm.send(p.encode(p.Cancel(id=1, batch_id=message.batch_id)))
            time.sleep(0.001 * (round_ % 7))
        with daemon.client() as other:
            for _ in range(10):
                assert other.call("read_file", {"path": "a.txt"}, timeout=10).content == "A"
    finally:
        storm.close()
        ctx.term()


def test_frames_that_arrive_while_replies_go_out_are_never_left_unread(daemon: DaemonProcess) -> None:
    """Attack: time requests to land while the daemon sends other clients' replies. A send
    can consume the edge of the socket's descriptor that announced them; the daemon wakes
    its receive loop only when frames wait, so a missed check would leave them unread until
    some other event. Each round ends quiet, so a stranded ping would never be answered."""
    (daemon.root / "a.txt").write_text("x" * 4096)
    rng = random.Random(7)
    ctx = zmq.Context()
    pinger = ctx.socket(zmq.DEALER)
    pinger.linger = 0
    pinger.connect(daemon.endpoint)
    clients = [daemon.client(timeout=5) for _ in range(3)]
    try:
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
            for round_ in range(300):
                reads = [pool.submit(c.call, "read_file", {"path": "a.txt"}) for c in clients]
                time.sleep(rng.uniform(0, 0.0015))  # land somewhere among their replies
                pinger.send(p.encode(p.Ping(id=round_)))
                assert all(r.result(timeout=10).ok for r in reads)
                assert pinger.poll(2000), f"ping {round_} left unread while nothing else happened"
                reply = decode_daemon_message(pinger.recv())
                assert isinstance(reply, p.Pong) and reply.id == round_
    finally:
        for client in clients:
            client.close()
        pinger.close()
        ctx.term()
