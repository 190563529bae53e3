"""The runner's side of an egress link, over a real socket pair: what the egress process
says about a call before the runner has registered it (the first connection can race the
spawn's reply) is kept, not lost or refused, and what belongs to no call that will come
does not take its room."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from toold_daemon.egress import calls as calls_module
from toold_daemon.egress.calls import (
    _EARLY_TOKENS,
    MAX_OPEN_QUESTIONS,
    MAX_RECORDS,
    Decide,
    EgressCall,
    EgressCalls,
    record_data,
)
from toold_daemon.egress.process import (
    EgressAnswer,
    EgressAsk,
    EgressForget,
    EgressForgotten,
    EgressRecord,
    EgressUsed,
    from_runner,
)
from toold_daemon.isolation.wire import FrameBuffer, frame


async def test_messages_for_a_call_not_registered_yet_are_kept() -> None:
    async def decide(call: object, host: str, port: int) -> tuple[bool, str]:
        return True, f"{host} allowed"

    async with served(decide, answer_forgets=False) as here:
        calls, link, egress = here.calls, here.link, here.egress
        record = EgressRecord(token="t", host="h", port=443, protocol="connect", sent=1, received=2)
        for message in (EgressUsed(id=2, token="t"), record, EgressAsk(id=1, token="t", host="h", port=443)):
            await egress.send(frame(message))
        await trio.sleep(0.05)
        calls.register("t", link, None)  # late: after the first connection
        answers = await _answers(egress, 2)
        assert answers == {1: EgressAnswer(id=1, allowed=True, why="h allowed"), 2: EgressAnswer(id=2, allowed=True)}

        async def forgotten() -> None:  # play the egress process: answer the forget
            await egress.recv(4096)
            await egress.send(frame(EgressForgotten(token="t")))

        assert here.nursery is not None
        here.nursery.start_soon(forgotten)
        assert await calls.forget("t") == {"network": record_data([record])}


async def _answers(egress: trio.socket.SocketType, count: int) -> dict[int, EgressAnswer]:
    """Read the runner's answers off the egress process's end until ``count`` have come."""
    buffer, answers = FrameBuffer(), dict[int, EgressAnswer]()
    with trio.fail_after(5):
        while len(answers) < count:
            for body in buffer.feed(await egress.recv(4096)):
                answer = from_runner.decode(body)
                assert isinstance(answer, EgressAnswer)
                answers[answer.id] = answer
    return answers


async def test_a_first_connection_goes_on_only_while_its_call_runs() -> None:
    """The runner answers a call's first connection (``EgressUsed``): yes while the call
    runs, no once it has been forgotten as a call without connections, when a connection
    that went on would be in no result and no journal row."""
    async with served(answer_forgets=False) as here:
        calls, link, egress = here.calls, here.link, here.egress
        calls.register("running", link, None)
        calls.register("ended", link, None)
        assert await calls.forget("ended") == {}  # no connection said: forgotten at once
        await egress.send(frame(EgressUsed(id=1, token="running")) + frame(EgressUsed(id=2, token="ended")))
        answers = await _answers(egress, 2)
        assert answers[1].allowed
        assert not answers[2].allowed and answers[2].why == "the call is not running"


async def test_no_connection_goes_on_once_the_call_is_being_forgotten() -> None:
    """Once the runner has asked for a call's records, a connection said after that would
    have no record in the result: it is refused."""
    async with served(answer_forgets=False) as here:
        calls, link, egress = here.calls, here.link, here.egress
        calls.register("t", link, None)
        await egress.send(frame(EgressUsed(id=1, token="t")))
        assert (await _answers(egress, 1))[1].allowed
        forgotten: dict[str, Any] = {}

        async def forget() -> None:
            forgotten.update(await calls.forget("t"))

        assert here.nursery is not None
        here.nursery.start_soon(forget)
        buffer = FrameBuffer()
        with trio.fail_after(5):  # the runner asks for the records
            assert isinstance(from_runner.decode(buffer.feed(await egress.recv(4096))[0]), EgressForget)
        await egress.send(frame(EgressUsed(id=2, token="t")))
        answer = (await _answers(egress, 1))[2]
        assert not answer.allowed and answer.why == "the call is not running"
        await egress.send(frame(EgressForgotten(token="t")))


async def _allow(call: object, host: str, port: int) -> tuple[bool, str]:
    return True, "allowed"


async def _answer_every_forget(egress: trio.socket.SocketType, answered: list[str]) -> None:
    """Play the egress process: answer each ``EgressForget`` as it does."""
    buffer = FrameBuffer()
    while data := await egress.recv(65536):
        for body in buffer.feed(data):
            message = from_runner.decode(body)
            if isinstance(message, EgressForget):
                await egress.send(frame(EgressForgotten(token=message.token)))
                answered.append(message.token)


@dataclass
class Served:
    """The runner's side serving a link over a real socket pair, and the egress process's
    end (answering forgets, unless the test plays that part itself)."""

    calls: EgressCalls
    link: trio.socket.SocketType
    egress: trio.socket.SocketType
    answered: list[str]
    nursery: trio.Nursery | None = None

    async def send(self, messages: list[msgspec.Struct]) -> None:
        view = memoryview(b"".join(frame(m) for m in messages))
        while view:
            view = view[await self.egress.send(view) :]


@asynccontextmanager
async def served(decide: Decide | None = None, *, answer_forgets: bool = True) -> AsyncIterator[Served]:
    ours, theirs = socket.socketpair()
    link, egress = trio.socket.from_stdlib_socket(ours), trio.socket.from_stdlib_socket(theirs)
    here = Served(EgressCalls(decide or _allow), link, egress, [])
    async with trio.open_nursery() as nursery:
        here.nursery = nursery
        nursery.start_soon(here.calls.serve, link)
        if answer_forgets:
            nursery.start_soon(_answer_every_forget, egress, here.answered)
        yield here
        nursery.cancel_scope.cancel()


async def _late_call_keeps_its_records(
    calls: EgressCalls, link: trio.socket.SocketType, egress: trio.socket.SocketType
) -> None:
    """A call whose first connection and its record arrive before it is registered."""
    record = EgressRecord(token="late", host="h", port=443, protocol="connect", sent=3, received=4)
    await egress.send(frame(EgressUsed(id=1, token="late")) + frame(record))
    await trio.sleep(0.05)
    calls.register("late", link, None)
    with trio.fail_after(5):
        assert await calls.forget("late") == {"network": record_data([record])}


async def test_answers_to_the_batched_forgets_of_quiet_calls_leave_room_for_early_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls without connections have their listeners closed a moment later, in one batch
    of forgets; the answers come for calls the runner is done with. More of them than the
    early messages have room for must not crowd out a racing call's first connection (its
    record would be lost from the journal and its result)."""
    monkeypatch.setattr(calls_module, "IDLE_FORGET_SECONDS", 0.01)
    quiet = calls_module._EARLY_TOKENS + 100
    async with served() as here:
        for i in range(quiet):
            here.calls.register(f"quiet-{i}", here.link, None)
            assert await here.calls.forget(f"quiet-{i}") == {}
        with trio.fail_after(10):
            while len(here.answered) < quiet:
                await trio.sleep(0.01)
        await trio.sleep(0.05)  # the last answers have been read
        await _late_call_keeps_its_records(here.calls, here.link, here.egress)


async def test_early_messages_no_call_came_for_make_room_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of calls the runner gave up on (their forget timed out) arrive for tokens
    that will never be registered: they are kept only for a while."""
    async with served() as here:
        await here.send(
            [EgressRecord(token=f"gone-{i}", host="h", port=443, protocol="connect") for i in range(_EARLY_TOKENS)]
        )
        await trio.sleep(0.2)
        monkeypatch.setattr(calls_module, "_EARLY_SECONDS", 0.1)  # as if they had waited long
        await _late_call_keeps_its_records(here.calls, here.link, here.egress)


async def test_a_call_lists_its_first_connections_and_counts_the_rest() -> None:
    """A command looping over connections cannot grow its result without bound."""
    async with served() as here:
        here.calls.register("busy", here.link, None)
        records = [
            EgressRecord(token="busy", host=f"h{i}", port=443, protocol="connect", sent=i, received=2 * i)
            for i in range(MAX_RECORDS)
        ]
        extra = [
            EgressRecord(token="busy", host="x", port=443, protocol="connect", sent=5, received=7),
            EgressRecord(token="busy", host="y", port=443, protocol="connect", refused="denied"),
            EgressRecord(token="busy", host="z", port=80, protocol="http", refused="denied"),
        ]
        await here.send([EgressUsed(id=1, token="busy"), *records, *extra])
        await trio.sleep(0.1)
        with trio.fail_after(5):
            data = await here.calls.forget("busy")
        assert data["network"] == record_data(records)
        assert data["network_omitted"] == {"connections": 3, "refused": 2, "sent": 5, "received": 7}


class Person:
    """Answers questions about hosts when told to, counting them."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.go = trio.Event()

    async def ask(self, host: str, port: int) -> tuple[bool, str]:
        self.asked.append((host, port))
        await self.go.wait()
        return True, f"{host} approved"


async def test_connections_waiting_on_the_same_new_host_share_one_question() -> None:
    call = EgressCall("t", None, None)  # type: ignore[arg-type]
    person = Person()
    answers: list[tuple[bool, str]] = []

    async def connect() -> None:
        answers.append(await call.ask_person("new.example", 443, person.ask))

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(connect)
        await trio.testing.wait_all_tasks_blocked()
        assert person.asked == [("new.example", 443)]
        person.go.set()
    assert answers == [(True, "new.example approved")] * 20
    await call.ask_person("new.example", 443, person.ask)  # a later connection: asked again
    assert person.asked == [("new.example", 443)] * 2


async def test_a_call_asks_about_a_few_hosts_at_a_time_and_refuses_more() -> None:
    call = EgressCall("t", None, None)  # type: ignore[arg-type]
    person = Person()
    answers: dict[str, tuple[bool, str]] = {}

    async def connect(host: str) -> None:
        answers[host] = await call.ask_person(host, 443, person.ask)

    hosts = [f"h{i}.example" for i in range(MAX_OPEN_QUESTIONS + 3)]
    async with trio.open_nursery() as nursery:
        for host in hosts:
            nursery.start_soon(connect, host)
        await trio.testing.wait_all_tasks_blocked()
        assert len(person.asked) == MAX_OPEN_QUESTIONS
        refused = [h for h in hosts if h in answers]  # answered at once, without asking
        assert len(refused) == 3
        assert all(not answers[h][0] and "already waits for answers" in answers[h][1] for h in refused)
        person.go.set()
    assert sum(allowed for allowed, _ in answers.values()) == MAX_OPEN_QUESTIONS
    assert call.questions == {}
    assert (await call.ask_person("later.example", 443, person.ask))[0]  # room again once answered


async def test_a_connection_said_just_before_the_command_ended_is_waited_for() -> None:
    """The egress process says a call connects before the connection goes on, so the
    command's end comes after it; but the runner may read the command's outcome first,
    with that message still unread on the link. Forgetting the call must not then take
    it for a call without connections (their records were lost)."""
    async with served(answer_forgets=False) as here:
        calls, link, egress = here.calls, here.link, here.egress
        await trio.testing.wait_all_tasks_blocked()  # the link's reader waits for data
        calls.register("t", link, None)
        record = EgressRecord(token="t", host="h", port=443, protocol="connect", refused="port 80 is not allowed")
        os.write(egress.fileno(), frame(EgressUsed(id=1, token="t")) + frame(record))  # no checkpoint: unread
        assert here.nursery is not None
        here.nursery.start_soon(_answer_every_forget, egress, here.answered)
        with trio.fail_after(5):
            assert await calls.forget("t") == {"network": record_data([record])}
        assert here.answered == ["t"]


async def test_an_egress_process_cannot_fill_the_runner_with_early_messages() -> None:
    """The egress process runs as the client: messages for calls never registered are
    kept within a bound whatever it sends, and the real early messages of a call that
    comes next are still not lost once the strays have expired or been taken."""
    async with served() as here:
        strays = [
            EgressRecord(token=f"gone-{i % 100}", host="h", port=443, protocol="connect")
            for i in range(calls_module._EARLY_MESSAGES * 3)
        ]
        await here.send(strays)
        await trio.sleep(0.3)
        assert here.calls._early_count == calls_module._EARLY_MESSAGES
        assert sum(len(kept) for _at, kept in here.calls._early.values()) == calls_module._EARLY_MESSAGES
        for i in range(100):  # their calls come after all, and take them
            here.calls.register(f"gone-{i}", here.link, None)
        assert here.calls._early_count == 0


async def test_a_record_past_its_bounds_is_garbage_and_closes_the_link(caplog: pytest.LogCaptureFixture) -> None:
    async with served() as here:
        here.calls.register("t", here.link, None)
        await here.send([EgressRecord(token="t", host="h" * 100_000, port=443, protocol="connect")])
        with trio.fail_after(5):
            while here.link.fileno() != -1:
                await trio.sleep(0.01)
        assert "garbage" in caplog.text
        assert here.calls._calls["t"].records == []


async def test_a_call_whose_zygote_kept_its_listener_costs_the_egress_process_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command that never connected had its listener closed by its zygote: the egress
    process never knew the call, so no forget goes to it (each would wake it, and be
    answered); a call whose listener went over is still forgotten there."""
    monkeypatch.setattr(calls_module, "IDLE_FORGET_SECONDS", 0.01)
    async with served() as here:
        for i in range(20):
            here.calls.register(f"kept-{i}", here.link, None)
            assert await here.calls.forget(f"kept-{i}", connected=False) == {}
        here.calls.register("handed", here.link, None)
        assert await here.calls.forget("handed") == {}
        with trio.fail_after(5):
            while not here.answered:
                await trio.sleep(0.01)
        await trio.sleep(0.05)  # a later batch would have come by now
        assert here.answered == ["handed"]
