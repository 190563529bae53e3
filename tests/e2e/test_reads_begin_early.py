"""A lone read goes to an idle worker as soon as it is planned, before its batch's task
runs (``Executor.begin``). On a real daemon: a cancel that arrives with the read leaves
its worker to serve the next read, a worker whose workspace was made anew in between
still gives way to a fresh one, and none of it leaves a worker behind."""

from __future__ import annotations

import os
import shutil
import time

import msgspec
import zmq

import toold_protocol as p
from tests.conftest import DaemonProcess
from tests.e2e.test_workers import workers_of


def read_request(request_id: int, path: str, batch_id: str, **extra: object) -> p.SubmitBatch:
    arguments = msgspec.Raw(p.encode_value({"path": path, **extra}))
    call = p.ToolCall(call_id="r", name="read_file", arguments=arguments)
    return p.SubmitBatch(id=request_id, calls=[call], batch_id=batch_id, events="results")


def test_reads_cancelled_as_they_arrive_end_cleanly_and_their_workers_serve_the_next(daemon: DaemonProcess) -> None:
    """A read cancelled before its task ran was already in its worker: the outcome is
    read and dropped, and the same worker serves the next read (no new worker to wait
    for); none is left busy or behind."""
    (daemon.root / "a.txt").write_text("hello\n")
    # The cancelled read scans 60,000 lines for its last: a few milliseconds in its worker,
    # so that the cancel can come while the read is there. A read of a few bytes answers
    # before the daemon has read the cancel, and it ends in its handler (a whole result).
    filler = 60_000
    (daemon.root / "long.txt").write_text("x\n" * filler + "hello\n")
    warm = daemon.client(timeout=30)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(daemon.endpoint)
    outcomes: list[p.BatchFinished] = []
    kept = 0  # cancelled reads whose worker served the next read
    told_apart = False  # workers can be found by their cgroup here
    try:
        before: set[int] = set()
        for i in range(20):
            assert warm.call("read_file", {"path": "a.txt"}).ok  # an idle worker to begin on
            now = set(workers_of(daemon))
            told_apart = told_apart or bool(now)
            if outcomes and outcomes[-1].state == "cancelled" and now and now == before:
                kept += 1
            before = now
            batch_id = f"early-{i}"
            # the cancel follows at once: the daemon usually reads both in one go, after
            # the read went to its worker and before the batch's task ran
            sock.send(p.encode(read_request(2 * i + 1, "long.txt", batch_id, start_line=filler + 1)))
            sock.send(p.encode(p.Cancel(id=2 * i + 2, batch_id=batch_id)))
            deadline = time.monotonic() + 10
            ended = len(outcomes) + 1
            while len(outcomes) < ended:
                assert sock.poll(max(0, int((deadline - time.monotonic()) * 1000))), f"{batch_id} never ended"
                message = p.decode_daemon_message(sock.recv())
                if isinstance(message, p.BatchAccepted) and message.outcome is not None:
                    message = message.outcome
                if isinstance(message, p.BatchFinished):
                    assert message.batch_id.split(":", 1)[-1] == batch_id  # reported as "uid:id"
                    outcomes.append(message)
            if outcomes[-1].state == "cancelled":
                # its worker scans on (~9 ms here), then drops the outcome and is idle again
                time.sleep(0.05)
    finally:
        warm.close()
        sock.close()
        ctx.term()
    for outcome in outcomes:
        [result] = outcome.results
        if outcome.state == "cancelled":
            assert result.error is not None and result.error.type == "Cancelled"
        else:  # the read won the race: a whole result
            assert outcome.state == "finished" and result.ok and "hello" in result.content
    assert any(o.state == "cancelled" for o in outcomes)
    if told_apart:
        assert kept, "every cancelled read cost its worker"
    with daemon.client(timeout=30) as client:
        for _ in range(20):
            result = client.call("read_file", {"path": "a.txt"})
            assert result.ok and "hello" in result.content
    # None left busy or behind: were each cancelled read to keep its worker busy, every
    # iteration would add a worker (and the reads would wait once the user's share of
    # them was busy). A cancel that came once the read's task waited for it ends the
    # worker instead (the work must stop), and a new one serves the next read. Up to
    # three: a scan may outlast the pause above on a loaded machine.
    assert len(workers_of(daemon)) <= 3


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
