"""The little the async client needs from its event loop, for asyncio and trio alike.

Which loop runs is found out at call time (no third-party dependency): waiting for
file descriptors to become readable, an event to wake other tasks, and a timeout.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, Protocol


class Event(Protocol):
    def set(self) -> None: ...

    async def wait(self) -> Any: ...


def running_trio() -> bool:
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def new_event() -> Event:
    if running_trio():
        import trio

        return trio.Event()
    return asyncio.Event()


async def with_timeout(awaitable: Awaitable[Any], timeout: float | None) -> bool:
    """Await ``awaitable``; False if ``timeout`` seconds passed first (it is then cancelled)."""
    if timeout is None:
        await awaitable
        return True
    if running_trio():
        import trio

        with trio.move_on_after(max(0.0, timeout)) as scope:
            await awaitable
        return not scope.cancelled_caught
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            await awaitable
    except TimeoutError:
        return False
    return True


async def wait_readable(fds: list[int]) -> None:
    """Return once any of ``fds`` is readable."""
    if running_trio():
        await _trio_wait_readable(fds)
    else:
        await _asyncio_wait_readable(fds)


async def _trio_wait_readable(fds: list[int]) -> None:
    import trio

    if len(fds) == 1:
        await trio.lowlevel.wait_readable(fds[0])
        return
    async with trio.open_nursery() as nursery:

        async def first(fd: int) -> None:
            await trio.lowlevel.wait_readable(fd)
            nursery.cancel_scope.cancel()

        for fd in fds:
            nursery.start_soon(first, fd)


async def _asyncio_wait_readable(fds: list[int]) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        for fd in fds:
            loop.remove_reader(fd)
