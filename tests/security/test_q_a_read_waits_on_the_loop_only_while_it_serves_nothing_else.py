"""A lone read's outcome may be waited for on the event loop's thread, outside the loop
(``BatchRuns._door_while_idle``, ``Workers.outcome_now``): up to a millisecond, asleep
in ``poll`` on the read's worker and the clients' door. Whatever else the loop serves
would wait for that wait: another user's command whose output comes, a write whose
journal record is waited for, a background job. So one user's stream of slow reads could
hold everyone else's work back by a millisecond each. The wait is only taken while the
loop serves nothing else, and the door rings for any client's frame.

The real submission path (``BatchRuns``, the planner, the executor, the journal's
absence) runs in-process; the runner begins every read and notes which door it is given
to wait on (the confined runner's wait itself is attacked in
``test_q_a_chattering_worker_cannot_hold_the_loop.py`` and ``tests/daemon/test_outcome_now.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

import toold_protocol as p
from tests.worker_stand_ins import Bystander, StandIn, StandIns
from toold_daemon.config import ApprovalConfig, Config, ToolsConfig
from toold_daemon.execution.executor import Executor
from toold_daemon.execution.runner import ThreadRunner
from toold_daemon.isolation import workers as workers_module
from toold_daemon.isolation.cgroup import Cgroups
from toold_daemon.isolation.jobs import Jobs
from toold_daemon.isolation.wire import Outcome, SpawnRequest
from toold_daemon.isolation.workers import Workers
from toold_daemon.sandbox import Sandbox
from toold_daemon.sandbox.workspaces import Workspaces
from toold_daemon.service.confirming import ConfirmationFlow
from toold_daemon.service.router import Service
from toold_daemon.service.running import BatchRuns
from toold_daemon.service.sessions import Session, Sessions
from toold_daemon.service.shared import Shared
from toold_daemon.tools import Tool, ToolContext, ToolOutput
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.registry import Registry

ME = p.Identity(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())


class Door:
    """The clients' door: a pipe a client rings by writing to it."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)

    def ringing(self) -> bool:
        try:
            return bool(os.read(self.read_end, 1)) and self._ring_again()
        except BlockingIOError:
            return False

    def _ring_again(self) -> bool:
        os.write(self.write_end, b"x")  # (looked at, not answered: it still rings)
        return True

    def fileno(self) -> int:
        return self.read_end

    def ring(self) -> None:
        os.write(self.write_end, b"x")

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


class BeginningRunner(ThreadRunner):
    """Begins every read, notes the door each was given to wait on, then answers it; a
    ``shell`` call (another user's command) runs until the test lets it end."""

    def __init__(self) -> None:
        super().__init__()
        self.doors: list[int | None] = []
        self.jobs = Jobs()
        self.command_may_end = trio.Event()
        self.serves_one_call: Callable[[], bool] | None = None

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: p.Identity) -> None:
        ctx.begun = (tool, args)

    def finished(self, ctx: ToolContext, interrupt_fd: int | None) -> ToolOutput | None:
        self.doors.append(interrupt_fd)
        tool, args = ctx.begun
        ctx.begun = None
        output: ToolOutput = tool.run(args, ctx)
        return output

    def jobs_running(self) -> bool:
        return self.jobs.any_running()

    def spin_only_when(self, serves_one_call: Callable[[], bool]) -> None:
        self.serves_one_call = serves_one_call

    async def run(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: p.Identity) -> ToolOutput:
        if tool.name == "shell":
            await self.command_may_end.wait()
            return ToolOutput("done")
        return await super().run(tool, args, ctx, identity)


@pytest.fixture
def door() -> Iterator[Door]:
    the_door = Door()
    yield the_door
    the_door.close()


def _parts(root: Path) -> tuple[Config, Registry, Sandbox]:
    registry = Registry()
    for tool in builtin_tools():
        registry.register(tool)
    config = Config(tools=ToolsConfig(approval=ApprovalConfig(preset="all")))  # the command runs unasked
    return config, registry, Sandbox([root])


def service(root: Path, door: Door) -> tuple[BatchRuns, BeginningRunner, list[bytes]]:
    config, registry, sandbox = _parts(root)
    runner = BeginningRunner()
    sent: list[bytes] = []
    shared = Shared(
        config=config,
        registry=registry,
        sandbox=sandbox,
        executor=Executor(runner, sandbox, config),
        send=lambda peer, frame, flush=False: sent.append(frame),
        sessions=Sessions(64, 16, lambda session: None),
        workspaces=Workspaces(config, sandbox),
        doorbell=door,
    )
    return BatchRuns(shared, ConfirmationFlow(shared)), runner, sent


def test_the_service_tells_its_runner_when_a_call_may_spin(tmp_path: Path, door: Door) -> None:
    """The runner learns the question from the service that owns the loop: with nothing
    else served a call may spin; a frame waiting says no."""
    config, registry, sandbox = _parts(tmp_path)
    runner = BeginningRunner()
    executor = Executor(runner, sandbox, config)
    Service(
        config=config, registry=registry, sandbox=sandbox, executor=executor, send=lambda *a, **k: None, doorbell=door
    )
    assert runner.serves_one_call is not None, "never told"
    assert runner.serves_one_call()
    door.ring()
    assert not runner.serves_one_call(), "a frame waits: no spin"


def submit(runs: BatchRuns, session: Session, name: str, arguments: dict[str, Any], request_id: int) -> None:
    call = p.ToolCall(call_id=f"c{request_id}", name=name, arguments=msgspec.Raw(p.encode_value(arguments)))
    runs.submit(session, p.SubmitBatch(id=request_id, calls=[call]))


def outcomes(sent: list[bytes]) -> list[p.BatchFinished]:
    decoded = [p.decode_daemon_message(frame) for frame in sent]
    found = [m.outcome if isinstance(m, p.BatchAccepted) else m for m in decoded]
    return [m for m in found if isinstance(m, p.BatchFinished)]


async def test_a_read_waits_only_while_the_loop_serves_nothing_else(tmp_path: Path, door: Door) -> None:
    (tmp_path / "f.txt").write_text("read\n")
    runs, runner, sent = service(tmp_path, door)
    reader = Session(session_id="reader", peer=b"reader", identity=ME)
    other = Session(session_id="other", peer=b"other", identity=ME)
    async with trio.open_nursery() as nursery:
        runs.shared.nursery = nursery
        submit(runs, reader, "read_file", {"path": "f.txt"}, 1)
        assert runner.doors == [door.fileno()], "alone, the read may wait on the door"

        submit(runs, other, "shell", {"command": "sleep 1"}, 2)  # another user's command runs
        await trio.testing.wait_all_tasks_blocked()
        submit(runs, reader, "read_file", {"path": "f.txt"}, 3)
        assert runner.doors[-1] is None, "a command runs: its output would wait for the wait"
        runner.command_may_end.set()
        await trio.testing.wait_all_tasks_blocked()

        runner.jobs.add(ME.uid, "a background job", 0)
        submit(runs, reader, "read_file", {"path": "f.txt"}, 4)
        assert runner.doors[-1] is None, "a background job's output would wait for the wait"
        for job in runner.jobs.running():
            job.state = "exited"

        door.ring()  # another client's frame is waiting
        submit(runs, reader, "read_file", {"path": "f.txt"}, 5)
        assert runner.doors[-1] is None, "a frame waits: it is served first"
        os.read(door.read_end, 16)

        submit(runs, reader, "read_file", {"path": "f.txt"}, 6)
        assert runner.doors[-1] == door.fileno(), "the loop is idle again"
        nursery.cancel_scope.cancel()
    finished = outcomes(sent)
    assert len(finished) == 6 and all(o.state == "finished" and o.results[0].ok for o in finished)
    assert [o.results[0].content for o in finished if o.results[0].call_id != "c2"] == ["read\n"] * 5


async def test_a_call_spins_for_its_outcome_only_while_its_batch_is_all_the_loop_serves(
    tmp_path: Path, door: Door, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task path's spin (up to ``SPIN_SECONDS`` of polling the worker's socket on the
    loop's thread) asks the same question: a spin while another user's work runs holds
    that work back. Here the spin is made long enough to see: the worker answers in 0.3 s;
    a spin of 1 s would leave the other task no turn meanwhile."""
    monkeypatch.setattr(workers_module, "SPIN_SECONDS", 1.0)
    monkeypatch.setattr(workers_module, "_SPARE_CORE", True)
    runs, _, _ = service(tmp_path, door)
    stand_ins = StandIns()
    pool = Workers(stand_ins.start, Cgroups(), pids_max=0, memory_max=0, max_workers=4, idle_seconds=60)
    pool.loop_serves_one_call = runs.serves_one_batch_alone
    request = SpawnRequest(call_id="w", token="t", tool="write_file", uid=ME.uid, gid=ME.gid, roots=["/"])
    try:
        await pool.ensure(request, b"config")
        for others_running, turns_wanted in ((1, 10), (0, 0)):
            runs._tasks = 1 + others_running  # this call's batch, and another's or none
            other = Bystander(pause=0.001)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(other.run)
                await trio.lowlevel.checkpoint()

                threading.Thread(target=_answer_late, args=(stand_ins.started[0],), daemon=True).start()
                turns_before = other.turns
                outcome = await pool.run(request, b"config", lambda chunk: None)
                nursery.cancel_scope.cancel()
            assert outcome.ok
            turns = other.turns - turns_before
            if others_running:
                assert turns >= turns_wanted, f"another batch runs: the call yielded ({turns} turns)"
            else:
                assert turns <= 2, f"nothing else to serve: the call spun ({turns} turns)"
    finally:
        runs._tasks = 0
        stand_ins.close()


def _answer_late(stand_in: StandIn) -> None:
    """The worker's answer in 0.3 s, from a thread of its own: it needs nothing of the loop."""
    stand_in.request()
    time.sleep(0.3)
    stand_in.say(Outcome(ok=True))
