"""The command supervisor with real commands and real pipes: one slow reader stalls only
its own command, and a reader that goes away ends that command."""

from __future__ import annotations

import os
import time

import psutil

from toold_daemon.isolation.command_start import start_command
from toold_daemon.isolation.supervisor import Supervisor
from toold_daemon.isolation.wire import Chunk, FrameBuffer, Limits, Outcome, SpawnRequest, child_decoder

LIMITS = Limits(cpu_seconds=60, address_space_bytes=1 << 32, file_size_bytes=1 << 30, open_files=256, processes=64)


def request(command: str, *, stream_limit: int = 8 << 20) -> SpawnRequest:
    return SpawnRequest(
        call_id="c", token="t", tool="shell", args=b"", config=b"", roots=[], resolved={},
        argv=["/bin/sh", "-c", command], cwd="/", env={"PATH": "/usr/bin:/bin"}, files={},
        uid=os.getuid(), gid=os.getgid(), network=True, network_namespace=False, writable=[], temp="/tmp",
        limits=LIMITS, idle_timeout_s=0.0, stream_limit_bytes=stream_limit, keep_bytes=4096, require=[],
        reads={},
    )  # fmt: skip


def start(supervisor: Supervisor, command: str) -> tuple[int, int]:
    """(pid, read end of its channel)."""
    read_end, write_end = os.pipe()
    req = request(command)
    pid, pipes = start_command(req, setsid=True)
    supervisor.add(req, write_end, pid, pipes, time.monotonic())
    os.set_blocking(read_end, False)
    return pid, read_end


def read_available(fd: int, buffer: FrameBuffer) -> list[Chunk | Outcome]:
    messages: list[Chunk | Outcome] = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return messages
        if not data:
            return messages
        messages += [child_decoder.decode(body) for body in buffer.feed(data)]


def read_to_the_outcome(
    supervisor: Supervisor, channel: int, max_wait: float | None = None
) -> tuple[Outcome, int, int]:
    """Read the command's channel as it comes, stepping the supervisor, until its outcome:
    (it, the characters streamed before it, how many steps that took)."""
    buffer, streamed, steps = FrameBuffer(), 0, 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for message in read_available(channel, buffer):
            if isinstance(message, Outcome):
                return message, streamed, steps
            streamed += len(message.data)
        if supervisor.active:
            supervisor.step(max_wait)
            steps += 1
    raise AssertionError("no outcome")


def test_a_lagging_reader_stalls_only_its_own_command() -> None:
    supervisor = Supervisor({"seccomp": "on"})
    chatty, chatty_channel = start(supervisor, "head -c 4000000 /dev/zero | tr '\\0' a")
    _quick, quick_channel = start(supervisor, "echo hi")
    quick_buffer, quick_messages = FrameBuffer(), []
    deadline = time.monotonic() + 10
    while not any(isinstance(m, Outcome) for m in quick_messages) and time.monotonic() < deadline:
        supervisor.step()
        quick_messages += read_available(quick_channel, quick_buffer)
    [outcome] = [m for m in quick_messages if isinstance(m, Outcome)]
    assert outcome.ok and outcome.data["stdout"] == "hi\n"
    assert outcome.layers == {"seccomp": "on"}
    settle = time.monotonic() + 0.5
    while time.monotonic() < settle:  # long enough to read all 4 MB, were it read
        supervisor.step(max_wait=0.05)
    # nobody read the chatty command's channel: it waits on its full pipe, alive
    assert psutil.Process(chatty).status() != psutil.STATUS_ZOMBIE
    assert supervisor.active

    final, streamed, _steps = read_to_the_outcome(supervisor, chatty_channel)
    assert final.ok
    assert streamed == 4_000_000  # every byte streamed once the reader caught up
    assert final.data["exit_code"] == 0
    assert not supervisor.active
    os.close(chatty_channel)
    os.close(quick_channel)


def test_a_reader_that_goes_away_ends_its_command() -> None:
    supervisor = Supervisor({})
    pid, channel = start(supervisor, "yes")
    supervisor.step()
    os.close(channel)
    deadline = time.monotonic() + 10
    while supervisor.active and time.monotonic() < deadline:
        supervisor.step()
    assert not supervisor.active
    assert not psutil.pid_exists(pid)  # killed and reaped, not left a zombie


def test_frames_stay_whole_when_writes_are_cut_short() -> None:
    """Frames resumed after a partial write decode whole: the length prefixes line up."""
    supervisor = Supervisor({})
    _pid, channel = start(supervisor, "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done")
    buffer, text, final = FrameBuffer(), [], None
    deadline = time.monotonic() + 20
    while final is None and time.monotonic() < deadline:
        time.sleep(0.001)  # read slowly, so the channel fills and writes are cut short
        for message in read_available(channel, buffer):
            if isinstance(message, Chunk):
                text.append(message.data)
            else:
                final = message
        if supervisor.active:
            supervisor.step()
    assert final is not None
    assert "".join(text).splitlines() == [f"line {i}" for i in range(2000)]
    os.close(channel)


def _open_fds() -> set[int]:
    """This process's open fds (compared as "none opened and left open": others, say a
    former test's sockets, may close meanwhile as they are collected)."""
    return {int(name) for name in os.listdir("/proc/self/fd")}


def test_what_a_command_held_is_closed_and_unwatched_once_its_outcome_is_out() -> None:
    """Once a command's outcome is out, its pipes and pidfd are closed and unwatched; a
    pipe that ends while the command runs on is unwatched at once (at its end it would
    be readable at every step: a busy loop)."""
    supervisor = Supervisor({})
    before = _open_fds()
    _pid, channel = start(supervisor, "true")
    outcome, _streamed, _steps = read_to_the_outcome(supervisor, channel, 1.0)
    assert outcome.ok and not supervisor.active
    os.close(channel)
    assert not _open_fds() - before and not supervisor._selector.get_map()

    _pid, channel = start(supervisor, "exec >&- 2>&-; sleep 0.3")  # its pipes end first
    outcome, _streamed, steps = read_to_the_outcome(supervisor, channel, 1.0)
    assert outcome.ok and outcome.data["exit_code"] == 0
    assert steps < 20, f"{steps} steps while it slept: a pipe at its end stayed watched"
    os.close(channel)
    assert not _open_fds() - before and not supervisor._selector.get_map()


def test_a_command_whose_reader_lagged_leaves_nothing_open() -> None:
    """Its pipes were unwatched while the reader lagged (paused) when they ended: closed
    all the same, and its every byte streamed."""
    supervisor = Supervisor({})
    before = _open_fds()
    _pid, channel = start(supervisor, "head -c 2000000 /dev/zero | tr '\\0' a")
    settle = time.monotonic() + 0.5
    while time.monotonic() < settle:  # nobody reads: its channel fills, its pipes pause
        supervisor.step(max_wait=0.05)
    final, streamed, _steps = read_to_the_outcome(supervisor, channel, 0.05)
    assert final.ok and streamed == 2_000_000
    assert not supervisor.active
    os.close(channel)
    assert not _open_fds() - before and not supervisor._selector.get_map()
