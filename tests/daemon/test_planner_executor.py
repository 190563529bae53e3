"""Planner checks and executor guarantees: order, one result per call, timeouts, cancel, crashes."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import trio
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.config import Config, TimeoutsConfig, ToolsConfig
from toold_daemon.execution.batches import Batch
from toold_daemon.execution.executor import Executor, NoRecorder
from toold_daemon.execution.runner import ThreadRunner
from toold_daemon.policy import planner
from toold_daemon.records.journal_writer import Commit
from toold_daemon.sandbox import Sandbox
from toold_daemon.tools import Tool, ToolArgs, ToolContext, ToolOutput
from toold_daemon.tools.builtin import builtin_tools
from toold_daemon.tools.registry import Registry
from toold_daemon.undo.restore import RestoreFiles
from toold_protocol import BatchFinished, CallFinished, CallStarted, Identity, ToolCall, encode_value

ME = Identity(uid=os.geteuid(), gid=os.getegid(), pid=os.getpid())


class SleepArgs(ToolArgs, frozen=True):
    seconds: float


class Sleep(Tool[SleepArgs]):
    """Waits cooperatively, like a long scan that checks for cancellation."""

    name: ClassVar[str] = "sleep"
    description: ClassVar[str] = "sleep"
    args_type = SleepArgs
    finished: ClassVar[list[str]] = []

    def run(self, args: SleepArgs, ctx: ToolContext) -> ToolOutput:
        ctx.cancelled.wait(args.seconds)
        ctx.check_cancelled()
        return ToolOutput(f"slept {args.seconds}")


class Boom(Tool[SleepArgs]):
    name: ClassVar[str] = "boom"
    description: ClassVar[str] = "raises"
    args_type = SleepArgs

    def run(self, args: SleepArgs, ctx: ToolContext) -> ToolOutput:
        raise RuntimeError("kaput \x1b[31m in red")


def setup(root: Path, config: Config | None = None) -> tuple[Registry, Sandbox, Config]:
    registry = Registry()
    for tool in [*builtin_tools(), Sleep(), Boom()]:
        registry.register(tool)
    return registry, Sandbox([root]), config or Config()


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id=call_id, name=name, arguments=msgspec.Raw(encode_value(arguments)))


def make_batch(calls: list[ToolCall], root: Path, config: Config | None = None) -> tuple[Batch, Executor]:
    registry, sandbox, cfg = setup(root, config)
    prepared = planner.Planner(registry, sandbox, cfg, ME).plan(calls)
    batch = Batch(batch_id="b", identity=ME, session_id="s", calls=prepared, results=[None] * len(prepared))
    return batch, Executor(ThreadRunner(), sandbox, cfg)


def test_planner_preresolves_each_kind_of_bad_call(root: Path) -> None:
    (root / "f.txt").write_text("x")
    config = Config(tools=ToolsConfig(max_tool_calls_per_batch=6, max_tool_args_bytes=100))
    calls = [
        call("1", "read_file", path="f.txt"),
        call("1", "read_file", path="f.txt"),
        call("2", "no_such_tool"),
        call("3", "read_file", path="f.txt", start_line="one"),
        call("4", "read_file", path="../etc/passwd"),
        call("5", "read_file", path="x" * 200),
        call("6", "read_file", path="f.txt"),
    ]
    registry, sandbox, _ = setup(root)
    codes = [
        p.result.error.code if p.result and p.result.error else None
        for p in planner.Planner(registry, sandbox, config, ME).plan(calls)
    ]
    assert codes == [
        None,
        "DUPLICATE_TOOL_CALL_ID",
        "UNKNOWN_TOOL",
        "BAD_ARGS",
        "PATH_TRAVERSAL",
        "LIMITS_EXCEEDED",
        "LIMITS_EXCEEDED",
    ]


def test_planner_property_44_any_wrong_type_is_a_validation_error(root: Path) -> None:
    registry, sandbox, config = setup(root)

    @given(
        st.one_of(
            st.integers(-(2**63), 2**63),
            st.lists(st.integers(0, 9)),
            st.booleans(),
            st.none(),
            st.floats(allow_nan=False),
        )
    )
    def check(bad: Any) -> None:
        [prepared] = planner.Planner(registry, sandbox, config, ME).plan([call("x", "read_file", path=bad)])
        assert prepared.result is not None and prepared.result.error is not None
        assert prepared.result.error.type == "BadArgs" and "$.path" in prepared.result.error.message

    check()


def test_summary_redacts_secrets() -> None:
    assert (
        planner.redact("curl -H 'Authorization: Bearer abc123' api_key=XYZ")
        == "curl -H 'Authorization: Bearer ***' api_key=***"
    )
    assert len(planner.redact("x" * 500)) == 200


async def run_batch(batch: Batch, executor: Executor) -> list[msgspec.Struct]:
    events: list[msgspec.Struct] = []
    await executor.run(batch, events.append)
    return events


async def test_calls_run_in_order_with_exactly_one_result_each(root: Path) -> None:
    (root / "a.txt").write_text("A")
    batch, executor = make_batch(
        [
            call("1", "read_file", path="a.txt"),
            call("2", "nope"),
            call("3", "boom", seconds=0),
            call("4", "read_file", path="a.txt"),
        ],
        root,
    )
    events = await run_batch(batch, executor)
    finished = [e for e in events if isinstance(e, CallFinished)]
    assert [e.result.call_id for e in finished] == ["1", "2", "3", "4"]
    assert [e.result.ok for e in finished] == [True, False, False, True]
    assert [e.call_id for e in events if isinstance(e, CallStarted)] == ["1", "3", "4"]
    crash = finished[2].result.error
    assert crash is not None and crash.message.startswith("Tool failed: RuntimeError: kaput")
    assert "\x1b" not in crash.message
    assert isinstance(events[-1], BatchFinished) and len(events[-1].results) == 4


async def test_timeout_yields_timeout_error_and_batch_goes_on(root: Path) -> None:
    # Real clock: trio's autojump clock would also jump while a worker thread is busy.
    from toold_daemon.config import TimeoutsConfig

    (root / "a.txt").write_text("A")
    config = Config(tools=ToolsConfig(timeouts=TimeoutsConfig(file_operations_seconds=0.2)))
    batch, executor = make_batch([call("1", "sleep", seconds=3600), call("2", "read_file", path="a.txt")], root, config)
    started = time.monotonic()
    events = await run_batch(batch, executor)
    assert time.monotonic() - started < 3
    results = [e.result for e in events if isinstance(e, CallFinished)]
    assert results[0].error is not None and results[0].error.type == "Timeout"
    assert results[0].error.details["timeout_ms"] == 200 and "timed out after 0.2s" in results[0].error.message
    assert results[1].ok


async def test_cancel_stops_current_call_and_resolves_the_rest(root: Path) -> None:
    batch, executor = make_batch([call(str(i), "sleep", seconds=30) for i in range(4)], root)
    events: list[msgspec.Struct] = []
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(executor.run, batch, events.append)
        await trio.sleep(0.05)
        batch.cancel("cancelled by the client")
    assert time.monotonic() - started < 5
    results = [e.result for e in events if isinstance(e, CallFinished)]
    assert [r.call_id for r in results] == ["0", "1", "2", "3"]
    assert all(r.error is not None and r.error.type == "Cancelled" for r in results)
    assert batch.state == "cancelled"
    assert threading.active_count() < 20


async def test_outer_cancellation_still_gives_every_call_a_result(root: Path) -> None:
    batch, executor = make_batch([call(str(i), "sleep", seconds=30) for i in range(3)], root)
    events: list[msgspec.Struct] = []
    with trio.move_on_after(0.05):
        await executor.run(batch, events.append)
    assert all(r is not None for r in batch.results)
    assert isinstance(events[-1], BatchFinished) and len(events[-1].results) == 3


async def test_output_is_truncated_within_the_limit(root: Path) -> None:
    from toold_daemon.config import OutputConfig

    (root / "big.txt").write_text("0123456789\n" * 5000)
    config = Config(tools=ToolsConfig(output=OutputConfig(max_bytes=1000)))
    batch, executor = make_batch([call("1", "read_file", path="big.txt")], root, config)
    await run_batch(batch, executor)
    result = batch.results[0]
    assert result is not None and result.truncated
    assert len(result.content.encode()) <= 1000 and "lines omitted]" in result.content


class BeginningRunner(ThreadRunner):
    """A ThreadRunner that keeps what the executor asks of a runner that can start a call
    early: which calls were begun, run (with which context) and abandoned."""

    def __init__(self) -> None:
        super().__init__()
        self.begun: list[ToolContext] = []
        self.ran: list[ToolContext] = []
        self.abandoned: list[ToolContext] = []

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> None:
        ctx.begun = "sent"
        self.begun.append(ctx)

    def abandon(self, ctx: ToolContext) -> None:
        self.abandoned.append(ctx)

    async def run(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> ToolOutput:
        self.ran.append(ctx)
        return await super().run(tool, args, ctx, identity)


def beginning(calls: list[ToolCall], root: Path, *, dry_run: bool = False) -> tuple[Batch, Executor, BeginningRunner]:
    batch, executor = make_batch(calls, root)
    batch.dry_run = dry_run
    runner = BeginningRunner()
    executor.runner = runner
    executor.begin(batch)
    return batch, executor, runner


async def test_a_lone_read_is_begun_and_run_with_the_same_context(root: Path) -> None:
    (root / "f.txt").write_text("early\n")
    batch, executor, runner = beginning([call("1", "read_file", path="f.txt")], root)
    assert len(runner.begun) == 1 and batch.calls[0].context is runner.begun[0]
    await run_batch(batch, executor)
    assert runner.ran == runner.begun and runner.abandoned == []
    assert [c.context for c in batch.calls] == [None]  # taken when it ran
    result = batch.results[0]
    assert result is not None and result.ok and "early" in result.content


async def test_a_begun_read_whose_batch_is_cancelled_first_is_abandoned_not_run(root: Path) -> None:
    (root / "f.txt").write_text("never read\n")
    batch, executor, runner = beginning([call("1", "read_file", path="f.txt")], root)
    batch.cancel("cancelled by the client")  # before the batch's task ran
    await run_batch(batch, executor)
    assert runner.ran == [] and runner.abandoned == runner.begun and len(runner.begun) == 1
    assert [c.context for c in batch.calls] == [None]
    result = batch.results[0]
    assert result is not None and result.error is not None and result.error.type == "Cancelled"


async def test_only_a_lone_read_that_runs_at_once_is_begun(root: Path) -> None:
    (root / "f.txt").write_text("x\n")
    read = call("1", "read_file", path="f.txt")
    cases = [
        beginning([read, call("2", "read_file", path="f.txt")], root),  # two calls
        beginning([call("1", "write_file", path="g.txt", content="y")], root),  # changes something
        beginning([read], root, dry_run=True),  # runs nothing
        beginning([call("1", "read_file", path="../outside")], root),  # refused at planning
        beginning([call("1", "no_such_tool")], root),
    ]
    for batch, _executor, runner in cases:
        assert runner.begun == [] and all(c.context is None for c in batch.calls)


class FinishingRunner(BeginningRunner):
    """A runner whose begun calls have their outcome at once (their worker answered while
    the batch was accepted): ``finished`` runs the tool then and there."""

    def finished(self, ctx: ToolContext, interrupt_fd: int | None) -> ToolOutput | None:
        tool, args = self.calls[ctx.call_id]
        return tool.run(args, ctx)

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> None:
        super().begin(tool, args, ctx, identity)
        self.calls[ctx.call_id] = (tool, args)

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, tuple[Tool[Any], Any]] = {}


def finishing(calls: list[ToolCall], root: Path) -> tuple[Batch, Executor]:
    batch, executor = make_batch(calls, root)
    executor.runner = FinishingRunner()
    batch.journaled_at_end = True
    executor.begin(batch)
    return batch, executor


async def test_a_read_whose_outcome_is_there_ends_at_once_as_run_would_have_ended_it(root: Path) -> None:
    (root / "f.txt").write_text("at once\n")
    ran, ran_executor = make_batch([call("1", "read_file", path="f.txt")], root)
    through_run = await run_batch(ran, ran_executor)

    batch, executor = finishing([call("1", "read_file", path="f.txt")], root)
    result = executor.finished_begun(batch, None)
    assert result is not None and result.ok and "at once" in result.content
    assert batch.calls[0].context is None and not batch.done.is_set()
    events: list[msgspec.Struct] = []
    executor.end_at_once(batch, result, events.append)
    assert [type(e) for e in events] == [type(e) for e in through_run] == [CallStarted, CallFinished, BatchFinished]
    assert batch.state == ran.state == "finished" and batch.done.is_set()
    outcome = events[-1]
    assert isinstance(outcome, BatchFinished) and outcome.results == [result]
    assert ran.results[0] is not None and result.content == ran.results[0].content
    assert executor.reads.for_paths("s", [str((root / "f.txt").resolve())]), "the read is remembered for edits"


async def test_a_read_that_failed_in_its_worker_ends_at_once_with_its_error(root: Path) -> None:
    (root / "f.txt").write_text("x\n")
    batch, executor = finishing([call("1", "read_file", path="f.txt")], root)
    (root / "f.txt").unlink()  # gone between planning and reading
    result = executor.finished_begun(batch, None)
    assert result is not None and result.error is not None and result.error.code == "FILE_NOT_FOUND"
    assert batch.calls[0].context is None


async def test_without_its_outcome_or_with_records_per_call_a_begun_read_is_left_to_run(root: Path) -> None:
    (root / "f.txt").write_text("later\n")
    batch, executor, runner = beginning([call("1", "read_file", path="f.txt")], root)
    batch.journaled_at_end = True
    assert executor.finished_begun(batch, None) is None  # (ThreadRunner: never at once)
    assert batch.calls[0].context is not None
    await run_batch(batch, executor)
    assert runner.ran == runner.begun and batch.results[0] is not None and batch.results[0].ok

    batch, executor = finishing([call("1", "read_file", path="f.txt")], root)
    batch.journaled_at_end = False
    executor.recorder = StartsUnrecorded()  # a journal that records each call: ``run`` must
    assert executor.finished_begun(batch, None) is None


async def test_a_cancel_that_comes_once_every_call_has_its_result_changes_nothing(root: Path) -> None:
    """A read's result was in when the cancel came (its client sent the cancel right after
    the batch): the batch said ``cancelled`` with a whole result, and its journal record
    (written with the last result, before the cancel) said ``finished``."""
    (root / "f.txt").write_text("x\n")
    batch, executor = make_batch([call("1", "read_file", path="f.txt"), call("2", "read_file", path="f.txt")], root)
    events: list[object] = []

    def emit(event: object) -> None:
        events.append(event)
        if isinstance(event, CallFinished) and event.index == 1:
            batch.cancel("the client cancelled")  # after the last result, before the end

    await executor.run(batch, emit)
    outcome = events[-1]
    assert isinstance(outcome, BatchFinished)
    assert outcome.state == "finished" and all(r.ok for r in outcome.results)

    batch, executor = make_batch([call("1", "read_file", path="f.txt"), call("2", "read_file", path="f.txt")], root)
    events = []

    def cancel_after_the_first(event: object) -> None:
        events.append(event)
        if isinstance(event, CallFinished) and event.index == 0:
            batch.cancel("the client cancelled")

    await executor.run(batch, cancel_after_the_first)
    outcome = events[-1]
    assert isinstance(outcome, BatchFinished) and outcome.state == "cancelled"
    assert outcome.results[0].ok and outcome.results[1].error is not None
    assert outcome.results[1].error.type == "Cancelled"


class StartsUnrecorded(NoRecorder):
    """The journal as a full disk leaves it: a call's started mark could not be committed."""

    def started(self, batch_id: str, index: int) -> Commit:
        commit = Commit(awaited=True)
        commit.error = sqlite3.OperationalError("database or disk is full")
        commit.settle()
        return commit


async def test_a_call_whose_start_the_journal_cannot_record_is_not_run_and_says_why(root: Path) -> None:
    (root / "a.txt").write_text("A")
    batch, executor = make_batch(
        [
            call("1", "read_file", path="a.txt"),
            call("2", "write_file", path="b.txt", content="B"),
            call("3", "write_file", path="c.txt", content="C"),
            call("4", "nope"),
        ],
        root,
    )
    executor.recorder = StartsUnrecorded()
    events = await run_batch(batch, executor)
    results = [r for r in batch.results if r is not None]
    assert [r.ok for r in results] == [True, False, False, False]
    for result in results[1:3]:
        assert result.error is not None and result.error.code == "NOT_JOURNALED", result
        assert "could not record that call 1 started: database or disk is full" in result.content
    assert results[3].error is not None and results[3].error.code == "UNKNOWN_TOOL"  # known without running
    assert not (root / "b.txt").exists() and not (root / "c.txt").exists()
    assert [type(e) for e in events].count(BatchFinished) == 1 and batch.state == "finished"


class Misreports(Tool[SleepArgs]):
    """An in-process plugin whose output breaks the daemon's bookkeeping (its read records
    are not a mapping): a defect the daemon meets after the tool has run."""

    name: ClassVar[str] = "misreports"
    description: ClassVar[str] = "returns malformed read records"
    args_type = SleepArgs

    def run(self, args: SleepArgs, ctx: ToolContext) -> ToolOutput:
        return ToolOutput("done", records="not a mapping")  # type: ignore[arg-type]


async def test_a_call_the_daemon_fails_on_says_so_and_the_batch_stops_there(root: Path) -> None:
    """A defect of the daemon's while it runs a call ended that call and the rest as
    "Cancelled: daemon stopped" (the daemon went on serving), and left the executor with
    the exception; now that call says the daemon failed on it, and the rest are not run."""
    (root / "a.txt").write_text("A")
    registry, sandbox, cfg = setup(root)
    registry.register(Misreports())
    calls = [
        call("1", "read_file", path="a.txt"),
        call("2", "misreports", seconds=0),
        call("3", "read_file", path="a.txt"),
    ]
    prepared = planner.Planner(registry, sandbox, cfg, ME).plan(calls)
    batch = Batch(batch_id="b", identity=ME, session_id="s", calls=prepared, results=[None] * len(prepared))
    events = await run_batch(batch, Executor(ThreadRunner(), sandbox, cfg))
    first, failed, unrun = (r for r in batch.results if r is not None)
    assert first.ok and failed.error is not None and unrun.error is not None
    assert failed.error.code == "INTERNAL_ERROR" and "AttributeError" in failed.content, failed.content
    assert "may have had effects" in failed.content
    assert unrun.error.code == "NOT_RUN" and unrun.content.endswith("Not run: the daemon failed while running call 1")
    assert [type(e) for e in events].count(BatchFinished) == 1 and batch.state == "finished"


def test_an_undo_may_run_longer_than_a_file_operation(root: Path) -> None:
    """An undo stopped midway leaves its tree half put back; bounded by its plan, it gets
    ten minutes, not the 30 s of a file operation (more if those are given more)."""
    _, executor = make_batch([], root)
    assert executor.timeout_for(RestoreFiles()) == 600.0
    slow = Config(tools=ToolsConfig(timeouts=TimeoutsConfig(file_operations_seconds=900.0)))
    assert Executor(ThreadRunner(), Sandbox([root]), slow).timeout_for(RestoreFiles()) == 900.0
