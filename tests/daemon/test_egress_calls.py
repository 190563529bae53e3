"""The runner's side of an egress link, over a real socket pair: what the egress process
says about a call before the runner has registered it (the first connection can race the
spawn's reply) is kept, not lost or refused."""

from __future__ import annotations

import socket

import trio

from toold_daemon.egress.calls import EgressCalls
from toold_daemon.egress.process import EgressAnswer, EgressAsk, EgressRecord, EgressUsed, from_runner
from toold_daemon.isolation.wire import FrameBuffer, frame


async def test_messages_for_a_call_not_registered_yet_are_kept() -> None:
    ours, theirs = socket.socketpair()
    link = trio.socket.from_stdlib_socket(ours)
    egress = trio.socket.from_stdlib_socket(theirs)

    async def decide(call: object, host: str, port: int) -> tuple[bool, str]:
        return True, f"{host} allowed"

    calls = EgressCalls(decide)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(calls.serve, link)
        record = EgressRecord(token="t", host="h", port=443, protocol="connect", sent=1, received=2)
        for message in (EgressUsed(token="t"), record, EgressAsk(id=1, token="t", host="h", port=443)):
            await egress.send(frame(message))
        await trio.sleep(0.05)
        calls.register("t", link, None)  # late: after the first connection
        answer = from_runner.decode(FrameBuffer().feed(await egress.recv(4096))[0])
        assert isinstance(answer, EgressAnswer) and answer.allowed and answer.why == "h allowed"

        async def forgotten() -> None:  # play the egress process: answer the forget
            await egress.recv(4096)
            from toold_daemon.egress.process import EgressForgotten

            await egress.send(frame(EgressForgotten(token="t")))

        nursery.start_soon(forgotten)
        assert await calls.forget("t") == [record]
        nursery.cancel_scope.cancel()
