"""A lone read goes to an idle worker as soon as it is planned, before its batch's task
runs (``Executor.begin``). On a real daemon: a cancel that arrives with the read ends
its worker and nothing else, a worker whose workspace was made anew in between still
gives way to a fresh one, and none of it leaves a worker behind."""

from __future__ import annotations

import os
import shutil
import time

import msgspec
import zmq

import toold_protocol as p
from tests.conftest import DaemonProcess
from tests.e2e.test_workers import workers_of


def read_request(request_id: int, path: str, batch_id: str) -> p.SubmitBatch:
    arguments = msgspec.Raw(p.encode_value({"path": path}))
    call = p.ToolCall(call_id="r", name="read_file", arguments=arguments)
    return p.SubmitBatch(id=request_id, calls=[call], batch_id=batch_id, events="results")


def test_reads_cancelled_as_they_arrive_end_cleanly_and_leave_no_worker_behind(daemon: DaemonProcess) -> None:
    (daemon.root / "a.txt").write_text("hello\n")
    warm = daemon.client(timeout=30)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(daemon.endpoint)
    outcomes: dict[str, p.BatchFinished] = {}
    try:
        for i in range(20):
            assert warm.call("read_file", {"path": "a.txt"}).ok  # an idle worker to begin on
            batch_id = f"early-{i}"
            # the cancel follows at once: the daemon usually reads both in one go, after
            # the read went to its worker and before the batch's task ran
            sock.send(p.encode(read_request(2 * i + 1, "a.txt", batch_id)))
            sock.send(p.encode(p.Cancel(id=2 * i + 2, batch_id=batch_id)))
            deadline = time.monotonic() + 10
            while not any(key.split(":", 1)[-1] == batch_id for key in outcomes):  # reported as "uid:id"
                assert sock.poll(max(0, int((deadline - time.monotonic()) * 1000))), f"{batch_id} never ended"
                message = p.decode_daemon_message(sock.recv())
                if isinstance(message, p.BatchFinished):
                    outcomes[message.batch_id] = message
                elif isinstance(message, p.BatchAccepted) and message.outcome is not None:
                    outcomes[message.outcome.batch_id] = message.outcome
    finally:
        warm.close()
        sock.close()
        ctx.term()
    for outcome in outcomes.values():
        [result] = outcome.results
        if outcome.state == "cancelled":
            assert result.error is not None and result.error.type == "Cancelled"
        else:  # the read won the race: a whole result
            assert outcome.state == "finished" and result.ok and "hello" in result.content
    assert any(o.state == "cancelled" for o in outcomes.values())
    with daemon.client(timeout=30) as client:
        for _ in range(20):
            result = client.call("read_file", {"path": "a.txt"})
            assert result.ok and "hello" in result.content
    deadline = time.monotonic() + 5
    while len(workers_of(daemon)) > 1:  # every abandoned worker was ended
        assert time.monotonic() < deadline, f"workers left behind: {workers_of(daemon)}"
        time.sleep(0.02)


def test_a_root_made_anew_between_two_reads_is_read_by_a_fresh_worker(daemon: DaemonProcess) -> None:
    """The idle worker's Landlock rules hold the old directory: it answers that its
    workspace was made anew, and the read that began on it is run on a fresh one."""
    (daemon.root / "a.txt").write_text("before\n")
    with daemon.client(timeout=30) as client:
        assert "before" in client.call("read_file", {"path": "a.txt"}).content
        old = workers_of(daemon)
        aside = daemon.root.with_name(daemon.root.name + "-old")
        os.rename(daemon.root, aside)
        daemon.root.mkdir()
        (daemon.root / "a.txt").write_text("after\n")
        try:
            result = client.call("read_file", {"path": "a.txt"})
        finally:
            shutil.rmtree(aside)
        assert result.ok and "after" in result.content, result.content
        if old:  # with cgroups the workers can be told apart
            assert not set(old) & set(workers_of(daemon))
