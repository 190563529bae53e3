"""The audit trail in a serving daemon: records are queued when they happen and built
and written by a task of their own once the event loop has done what was due, in
order, as they were when they happened, and none is left unwritten at stop."""

from __future__ import annotations

import io
import logging
import re

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon.execution.batches import Batch, PreparedCall
from toold_daemon.records.audit import GATHER_SECONDS, AuditTrail, Fields, LineSink
from toold_daemon.records.logs import quoted
from toold_protocol import Identity, ToolResult

ME = Identity(uid=1000, gid=1000, pid=42)


def batch_of(*calls: PreparedCall) -> Batch:
    return Batch(batch_id="b1", identity=ME, session_id="s1", calls=list(calls), results=[None] * len(calls))


def asking_call(index: int = 0) -> PreparedCall:
    return PreparedCall(index=index, call_id=f"c{index}", name="shell", tool=None, args=None, needs_confirmation=True)


def ok(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, ok=True, content="done", duration_ms=1.0)


class Written:
    def __init__(self) -> None:
        self.records: list[tuple[str, Fields]] = []

    def __call__(self, kind: str, fields: Fields) -> None:
        self.records.append((kind, dict(fields)))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.records]


def trail() -> tuple[Written, AuditTrail, PreparedCall, Batch]:
    """A trail writing to a list, and a batch of one call asking for approval."""
    written = Written()
    call = asking_call()
    return written, AuditTrail(written), call, batch_of(call)


async def test_records_wait_for_the_loop_and_come_out_in_order() -> None:
    written, audit, call, batch = trail()
    async with trio.open_nursery() as nursery:
        audit.bind_nursery(nursery)
        audit.batch_accepted(batch, "editor", "/w", None)
        audit.answered(batch, call, "approved", ME)
        audit.result(batch, 0, ok("c0"))
        assert written.records == []  # nothing built on the caller's time
        await trio.testing.wait_all_tasks_blocked()
        assert written.kinds() == ["batch", "decision", "answer", "result"]
        nursery.cancel_scope.cancel()


async def test_a_decision_is_recorded_as_it_was_when_the_batch_was_accepted() -> None:
    """An approval flips the call to run before the queued record is built: the record
    still says the policy asked."""
    written = Written()
    audit = AuditTrail(written)
    call = asking_call()
    async with trio.open_nursery() as nursery:
        audit.bind_nursery(nursery)
        audit.batch_accepted(batch_of(call), "editor", "/w", None)
        call.needs_confirmation = False  # approved
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    decision = next(fields for kind, fields in written.records if kind == "decision")
    assert decision["TOOLD_DECISION"] == "ask"


async def test_a_record_that_fails_is_logged_and_the_others_are_written(caplog: pytest.LogCaptureFixture) -> None:
    failures = iter([RuntimeError("the sink broke once")])

    def sink(kind: str, fields: Fields) -> None:
        if kind == "answer" and (failure := next(failures, None)) is not None:
            raise failure
        written(kind, fields)

    written = Written()
    audit = AuditTrail(sink)
    call = asking_call()
    batch = batch_of(call)
    with caplog.at_level(logging.ERROR):
        async with trio.open_nursery() as nursery:
            audit.bind_nursery(nursery)
            audit.answered(batch, call, "approved", ME)
            audit.result(batch, 0, ok("c0"))
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert written.kinds() == ["result"]
    assert "audit record could not be written" in caplog.text


async def test_records_queued_when_the_daemon_stops_are_written() -> None:
    written, audit, _call, batch = trail()
    async with trio.open_nursery() as nursery:
        audit.bind_nursery(nursery)
        await trio.testing.wait_all_tasks_blocked()
        audit.batch_accepted(batch, "editor", "/w", None)
        nursery.cancel_scope.cancel()  # before the writer ran: its way out writes them
    assert written.kinds() == ["batch", "decision"]
    audit.result(batch, 0, ok("c0"))  # a batch ending after the writer stopped
    assert written.kinds() == ["batch", "decision"]
    audit.write_queued()  # what the server does last
    assert written.kinds() == ["batch", "decision", "result"]


def test_without_a_loop_records_are_written_at_once() -> None:
    written = Written()
    call = asking_call()
    AuditTrail(written).result(batch_of(call), 0, ok("c0"))
    assert written.kinds() == ["result"]


class CountedWrites(io.StringIO):
    """A line-buffered stream that counts its writes (each is a system call on stderr)."""

    line_buffering = True

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


async def test_lines_of_the_records_written_together_go_out_in_one_write() -> None:
    stream = CountedWrites()
    audit = AuditTrail(LineSink(stream))
    call = asking_call()
    batch = batch_of(call)
    async with trio.open_nursery() as nursery:
        audit.bind_nursery(nursery)
        audit.batch_accepted(batch, "editor", "/w", None)
        audit.result(batch, 0, ok("c0"))
        await trio.testing.wait_all_tasks_blocked()
        lines = stream.getvalue().splitlines()
        assert [line.split()[0] for line in lines] == ["audit=batch", "audit=decision", "audit=result"]
        assert stream.writes == 1
        audit.answered(batch, call, "approved", ME)  # a later pass writes its own...
        await trio.testing.wait_all_tasks_blocked()
        assert stream.writes == 1  # ...once what comes meanwhile has gathered with it
        await trio.sleep(GATHER_SECONDS)
        await trio.testing.wait_all_tasks_blocked()
        assert stream.getvalue().splitlines()[3].startswith("audit=answer")
        assert stream.writes == 2
        nursery.cancel_scope.cancel()


def test_without_a_loop_each_line_is_written_at_once() -> None:
    stream = CountedWrites()
    audit = AuditTrail(LineSink(stream))
    call = asking_call()
    audit.result(batch_of(call), 0, ok("c0"))
    assert stream.getvalue().startswith("audit=result ")
    audit.answered(batch_of(call), call, "denied", ME)
    assert stream.getvalue().splitlines()[1].startswith("audit=answer ")
    assert stream.writes == 2


@given(st.one_of(st.text(), st.text(alphabet=st.sampled_from('aZ09_.:/@+- ="\n\té'))))
def test_a_field_goes_bare_only_when_it_is_one_safe_word(value: str) -> None:
    stream = io.StringIO()
    sink = LineSink(stream)
    sink("result", {"TOOLD_TOOL": value})
    sink.flush()
    safe = re.fullmatch(r"[A-Za-z0-9_.:/@+-]+", value) is not None
    assert stream.getvalue() == f"audit=result tool={value if safe else quoted(value)}\n"
