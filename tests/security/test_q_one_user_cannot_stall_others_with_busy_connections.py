"""Q. One user cannot stall everyone else's calls by keeping many connections busy, or by
sending requests that are costly to plan.

What was found (a second uid against a real daemon, this machine):

- libzmq hands a ROUTER's frames over fairly per connection, and the daemon served them
  in that order: a user with 200 connections, each with 8 pings queued, got 200 turns for
  each of another user's, whose reads took 32 ms (median) instead of 0.7.
- Reading a shell command for the policy cost the event loop up to 200 ms for 64 KB (per
  character Python, one expansion quadratic), and the denied-file check 35 µs per word;
  16 connections asking ``explain_policy`` of long commands left another user 3 reads in
  4 seconds (1.7 s each).
- A batch may carry any number of calls: 50,000 calls past the daemon's limit were each
  answered with an error, 0.8 s of the loop per frame.

Now frames wait in one queue per uid, served in rotation; a command's reading stops past
512 words or 8,192 characters read one at a time (the command is then asked about); a
batch carries at most 256 calls (more is an invalid message).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

import toold_protocol as p
from tests.conftest import DaemonProcess, reachable_daemon, start_daemon
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser
from toold_client import CallSpec, Decision

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")

SECONDS = 3.0


DENY_PATCHES = """
[[tools.approval.rules]]
tool = "apply_patch"
decision = "deny"
"""


@pytest.fixture
def shared_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with reachable_daemon(tmp_path, config=DENY_PATCHES) as d:
        (d.root / "note.txt").write_text("still here\n")
        yield d


def greeted(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """A raw connection that has said hello."""
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(p.encode(p.Hello(id=0, client_name="busy")))
    assert sock.poll(10_000)
    assert isinstance(p.decode_daemon_message(sock.recv()), p.Welcome)
    return sock


def keep_busy(
    endpoint: str, connections: int, depth: int, request: Callable[[int], p.ClientMessage], seconds: float = SECONDS
) -> None:
    """(In the attacker's process.) Keep ``depth`` requests waiting on each of
    ``connections`` connections for ``seconds`` + 1; print how many were answered."""
    ctx = zmq.Context()
    sockets = [greeted(ctx, endpoint) for _ in range(connections)]
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    print("ready", flush=True)
    waiting = dict.fromkeys(sockets, 0)
    sent = answered = 0
    deadline = time.monotonic() + seconds + 1
    while time.monotonic() < deadline:
        for sock in sockets:
            while waiting[sock] < depth:
                sent += 1
                sock.send(p.encode(request(sent)))
                waiting[sock] += 1
        for sock, _ in poller.poll(100):
            try:
                while True:
                    sock.recv(zmq.NOBLOCK)
                    waiting[sock] -= 1  # pings, explanations: one frame answers one request
                    answered += 1
            except zmq.Again:
                pass
    print(f"answered {answered}", flush=True)


def reads_during(daemon: DaemonProcess, attacker: OtherUser, seconds: float = SECONDS) -> list[float]:
    """Read a file back to back while the attack runs; each read's seconds."""
    assert attacker.line().strip() == "ready"
    waits: list[float] = []
    with daemon.client(timeout=30) as client:
        time.sleep(0.3)  # the attack is under way
        deadline = time.monotonic() + seconds - 0.5
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert client.call("read_file", {"path": "note.txt"}).ok
            waits.append(time.monotonic() - started)
    return waits


def attack(
    daemon: DaemonProcess,
    connections: int,
    depth: int,
    request: Callable[[int], p.ClientMessage],
    seconds: float = SECONDS,
) -> list[float]:
    """Run the attack; the victim's reads meanwhile (seconds each)."""
    busy = lambda: keep_busy(daemon.endpoint, connections, depth, request, seconds)  # noqa: E731
    waits, _ = victim_beside(daemon, busy, seconds)
    return waits


def victim_beside(
    daemon: DaemonProcess, attack: Callable[[], None], seconds: float = SECONDS
) -> tuple[list[float], list[str]]:
    """Run ``attack`` as the other user while the victim reads: the victim's waits
    (seconds each), and the words of the attacker's last line (what it got answered)."""
    attacker = OtherUser(attack)
    try:
        waits = reads_during(daemon, attacker, seconds)
        answered = attacker.line().split()
    finally:
        attacker.kill()
    print(f"victim: {len(waits)} reads, median {statistics.median(waits) * 1000:.1f} ms; attacker: {answered}")
    assert daemon.proc.poll() is None
    return waits, answered


def test_many_busy_connections_buy_one_user_no_more_turns(shared_daemon: DaemonProcess) -> None:
    """200 connections of one uid, each with 8 pings always waiting: another user's reads
    wait for one frame of theirs, not 200 (32 ms median before, about 5 here after).

    The same 1,600 pings kept waiting on 8 connections are the yardstick, measured in the
    same run: the victim's reads cost the same whatever the number of connections the
    pings come on. Served per connection, the 200 would cost 25 times the 8's turns (an
    absolute bound failed on a loaded machine, where the daemon, the attacker and the
    worker share two CPUs: 19 ms a read under the 200)."""
    ping = lambda n: p.Ping(id=n)  # noqa: E731
    few = statistics.median(attack(shared_daemon, 8, 200, ping, seconds=2.0))
    many = statistics.median(attack(shared_daemon, 200, 8, ping, seconds=2.0))
    assert many < max(2 * few, 0.005), (many, few)


def long_command(n: int) -> p.ExplainPolicy:
    """A different 64 KB command each time (a reading is cached per command text)."""
    command = (f"a{n};" + "b;" * 40_000)[: 64 * 1024 - 1]
    return p.ExplainPolicy(id=n, name="shell", arguments=msgspec.Raw(msgspec.msgpack.encode({"command": command})))


def test_commands_costly_to_read_cost_their_sender_only(shared_daemon: DaemonProcess) -> None:
    """16 connections keep asking the policy about distinct 64 KB commands: before, the
    other user got 3 reads in 4 seconds."""
    waits = attack(shared_daemon, 16, 8, long_command)
    assert len(waits) > 50, len(waits)
    assert statistics.median(waits) < 0.05, statistics.median(waits)


def test_a_batch_of_more_calls_than_the_protocol_carries_is_refused_whole(shared_daemon: DaemonProcess) -> None:
    def calls(count: int) -> list[p.ToolCall]:
        read = msgspec.Raw(msgspec.msgpack.encode({"path": "note.txt"}))
        return [p.ToolCall(call_id=f"c{i}", name="read_file", arguments=read) for i in range(count)]

    ctx = zmq.Context()
    sock = greeted(ctx, shared_daemon.endpoint)
    try:
        sock.send(p.encode(p.SubmitBatch(id=7, calls=calls(p.MAX_CALLS_PER_BATCH + 1), events="results")))
        assert sock.poll(10_000)
        refused = p.decode_daemon_message(sock.recv())
        assert isinstance(refused, p.Error) and refused.id == 7, refused
        assert refused.code == p.ProtocolErrorCode.INVALID_MESSAGE
        assert f"<= {p.MAX_CALLS_PER_BATCH}" in refused.message
        # As many as the protocol carries: the daemon's own limit (8) runs, the rest are told.
        sock.send(p.encode(p.SubmitBatch(id=8, calls=calls(p.MAX_CALLS_PER_BATCH), events="results")))
        finished = None
        while not isinstance(finished, p.BatchFinished):
            assert sock.poll(10_000)
            finished = p.decode_daemon_message(sock.recv())
        assert sum(r.ok for r in finished.results) == 8
        assert {r.error.code for r in finished.results if r.error is not None} == {"LIMITS_EXCEEDED"}
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_user_pipelining_alone_is_served_in_order(shared_daemon: DaemonProcess) -> None:
    """The rotation keeps each connection's order: 500 pings sent at once come back in order."""
    ctx = zmq.Context()
    sock = greeted(ctx, shared_daemon.endpoint)
    try:
        for n in range(500):
            sock.send(p.encode(p.Ping(id=n)))
        answered = []
        while len(answered) < 500:
            assert sock.poll(10_000)
            pong = p.decode_daemon_message(sock.recv())
            assert isinstance(pong, p.Pong)
            answered.append(pong.id)
        assert answered == list(range(500))
    finally:
        sock.close(linger=0)
        ctx.term()


def many_files_patch(n: int, name: str) -> str:
    """A patch adding ``n`` files, the first named ``name`` (a parse is cached per patch
    text): planning checks every path against the sandbox before the policy (which denies
    apply_patch here, so the batch ends at once, its cost all in planning)."""
    added = "".join(f"*** Add File: d{i}/f{i}.txt\n+x\n" for i in range(n))
    return f"*** Begin Patch\n*** Add File: {name}\n+x\n{added}*** End Patch\n"


def costly_batch(n: int) -> p.SubmitBatch:
    """Eight calls (the daemon's limit) each costly to plan; each batch's patches differ."""
    calls = [
        p.ToolCall(
            call_id=f"c{i}",
            name="apply_patch",
            arguments=msgspec.Raw(msgspec.msgpack.encode({"patch": many_files_patch(3000, f"b{n}c{i}.txt")})),
        )
        for i in range(8)
    ]
    return p.SubmitBatch(id=n, calls=calls, events="results")


def test_batches_costly_to_plan_are_planned_off_the_event_loop(shared_daemon: DaemonProcess) -> None:
    """Four connections keep submitting batches of eight patches adding 3,000 files each
    (half a second of planning a frame, all of it on the loop before): another user's
    reads go on at their usual pace, and the costly batches are still planned and answered."""
    waits, answered = victim_beside(shared_daemon, lambda: keep_submitting(shared_daemon.endpoint))
    assert answered[0] == "answered" and int(answered[1]) >= 1, answered  # planned, and answered
    assert statistics.median(waits) < 0.05, statistics.median(waits)
    assert max(waits) < 1.0, max(waits)


def keep_submitting(endpoint: str) -> None:
    """(In the attacker's process.) Four connections, each with one costly batch always
    waiting, for ``SECONDS`` + 1, and on until the first is answered (within 30 s more:
    planning aside shares the interpreter with the loop serving the victim, so on a slow
    machine the first answer may come late); print how many finished."""
    ctx = zmq.Context()
    sockets = [greeted(ctx, endpoint) for _ in range(4)]
    frames = [p.encode(costly_batch(n)) for n in range(4)]  # made once: the attacker's CPU is not the point
    for sock, frame in zip(sockets, frames, strict=True):
        sock.send(frame)
    print("ready", flush=True)
    finished = 0
    deadline = time.monotonic() + SECONDS + 1
    poller = zmq.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    while time.monotonic() < deadline or (not finished and time.monotonic() < deadline + 30):
        for sock, _ in poller.poll(100):
            message = p.decode_daemon_message(sock.recv())
            if isinstance(message, (p.BatchFinished, p.Error)):
                finished += isinstance(message, p.BatchFinished)
                sock.send(frames[sockets.index(sock)])
    print(f"answered {finished}", flush=True)


def test_a_sessions_batches_are_accepted_in_the_order_sent_when_one_is_planned_aside(
    shared_daemon: DaemonProcess,
) -> None:
    ctx = zmq.Context()
    sock = greeted(ctx, shared_daemon.endpoint)
    try:
        sock.send(p.encode(costly_batch(1)))  # planned on a thread
        read = msgspec.Raw(msgspec.msgpack.encode({"path": "note.txt"}))
        sock.send(p.encode(p.SubmitBatch(id=2, calls=[p.ToolCall(call_id="r", name="read_file", arguments=read)])))
        accepted = []
        while len(accepted) < 2:
            assert sock.poll(30_000)
            message = p.decode_daemon_message(sock.recv())
            if isinstance(message, p.BatchAccepted):
                accepted.append(message.id)
            assert not isinstance(message, p.Error), message
        assert accepted == [1, 2]
    finally:
        sock.close(linger=0)
        ctx.term()


def test_arguments_an_approver_changes_are_replanned_off_the_event_loop(tmp_path: Path) -> None:
    """Approving a batch of four patches, each replaced by one naming 6,000 files that are
    not there: the re-planning checked every path on the loop (about half a second), and
    every client's calls waited; now it is planned aside as a costly batch is. (The
    patches then fail when they run: the files they update are missing.)"""
    root = tmp_path / "root"
    root.mkdir()
    daemon = start_daemon(tmp_path, root)
    updates = "".join(f"*** Update File: d{i}/f{i}.txt\n@@\n-a\n+b\n" for i in range(6000))
    header = "*** Begin Patch\n*** Update File: m{}.txt\n@@\n-a\n+b\n"
    replaced = {f"call_{n}": {"patch": header.format(n) + updates + "*** End Patch\n"} for n in range(4)}
    adds = "*** Begin Patch\n*** Add File: s{}.txt\n+x\n*** End Patch\n"
    small = [CallSpec("apply_patch", {"patch": adds.format(n)}) for n in range(4)]
    pings: list[float] = []
    answered = threading.Event()
    done = threading.Event()

    def ping_meanwhile() -> None:
        with daemon.client(timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                client.ping(timeout=30)
                if answered.is_set():
                    pings.append(time.monotonic() - started)

    def replace_them(request: p.ConfirmationRequested) -> Decision:
        answered.set()
        return Decision("approve_all", modified_arguments=replaced)

    pinger = threading.Thread(target=ping_meanwhile)
    pinger.start()
    try:
        with daemon.client(timeout=60) as client:
            outcome = client.submit(small, on_confirm=replace_them)
    finally:
        done.set()
        pinger.join(30)
        daemon.stop()
    assert all(result.error is not None for result in outcome.results), outcome.results  # the replacements ran
    assert not (root / "s0.txt").exists()
    assert pings and max(pings) < 0.3, max(pings, default=None)
