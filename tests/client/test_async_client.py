"""AsyncClient against a real daemon, under trio (pytest-trio) and under asyncio."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import toold_protocol as p
from tests.conftest import DaemonProcess, module_daemon
from tests.e2e.test_isolation import alive_with
from toold_client import APPROVE_ALL, AsyncClient, Decision, RemoteError

CONFIG = """
[tools.approval]
allowlist = ["shell"]
timeout_seconds = 20
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "async", CONFIG) as d:
        (d.root / "hello.txt").write_text("hello from the root\n")
        yield d


async def exercise(endpoint: str, root: Path, sleep: Any) -> dict[str, Any]:
    """The same steps under either loop; ``sleep`` is that loop's sleep."""
    seen: list[Any] = []
    asked: list[p.ConfirmationRequested] = []

    async def approve(request: p.ConfirmationRequested) -> Decision:
        asked.append(request)
        await sleep(0)
        return APPROVE_ALL

    async with AsyncClient(endpoint) as client:
        rtt = await client.ping()
        names = [t.name for t in await client.tools()]  # type: ignore[union-attr]
        read = await client.call("read_file", {"path": "hello.txt"})
        streamed = await client.call("shell", {"command": "echo one; echo two >&2"}, on_event=seen.append)
        target = f"w-{uuid.uuid4().hex[:6]}.txt"
        (root / target).write_text("old")
        overwrite = {"path": target, "content": "x", "overwrite": True}
        written = await client.call("write_file", overwrite, on_confirm=approve)
        with pytest.raises(RemoteError) as refused:
            await client.get_batch("no-such-batch")
    return {
        "rtt": rtt,
        "names": names,
        "read": read,
        "chunks": [(e.stream, e.data) for e in seen if isinstance(e, p.OutputChunk)],
        "streamed": streamed,
        "written": written,
        "target": (root / target).read_text(),
        "asked": [c.name for r in asked for c in r.calls],
        "refused": refused.value.code,
    }


def check(found: dict[str, Any]) -> None:
    assert 0 < found["rtt"] < 1
    assert {"read_file", "shell", "write_file"} <= set(found["names"])
    assert found["read"].ok and found["read"].content.endswith("hello from the root\n")
    assert found["chunks"] == [("stdout", "one\n"), ("stderr", "two\n")]
    assert found["streamed"].ok
    assert found["written"].ok and found["target"] == "x" and found["asked"] == ["write_file"]
    assert found["refused"] == "UNKNOWN_BATCH"


async def test_under_trio(daemon: DaemonProcess) -> None:
    check(await exercise(daemon.endpoint, daemon.root, trio.sleep))


def test_under_asyncio(daemon: DaemonProcess) -> None:
    check(asyncio.run(exercise(daemon.endpoint, daemon.root, asyncio.sleep)))


async def test_many_tasks_share_one_connection_under_trio(daemon: DaemonProcess) -> None:
    results: dict[int, str] = {}
    async with AsyncClient(daemon.endpoint) as client:

        async def one(n: int) -> None:
            result = await client.call("shell", {"command": f"sleep 0.{n % 3}; echo {n}"})
            results[n] = result.content.splitlines()[0]

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(one, n)
    assert results == {n: str(n) for n in range(12)}


def test_many_tasks_share_one_connection_under_asyncio(daemon: DaemonProcess) -> None:
    async def main() -> list[str]:
        async with AsyncClient(daemon.endpoint) as client:
            results = await asyncio.gather(
                *(client.call("read_file", {"path": "hello.txt"}) for _ in range(12)), client.ping()
            )
        return [r.content for r in results[:-1]]  # type: ignore[union-attr]

    contents = asyncio.run(main())
    assert len(contents) == 12 and all(c.endswith("hello from the root\n") for c in contents)


async def test_cancelling_the_awaiting_task_cancels_the_batch_under_trio(daemon: DaemonProcess) -> None:
    marker = f"35{uuid.uuid4().int % 10**6:06d}"
    async with AsyncClient(daemon.endpoint) as client:
        started = time.monotonic()
        with trio.move_on_after(1.0):
            await client.call("shell", {"command": f"echo begun; sleep {marker}"})
        assert time.monotonic() - started < 2
        batches = await client.list_batches(limit=1)
        status = await _settled(client, batches[0].batch_id, trio.sleep)
        assert await client.ping() < 1  # the connection is still usable
    assert status.state == "cancelled"
    assert status.results[0].error is not None and status.results[0].error.type == "Cancelled"
    assert gone(marker)


def test_cancelling_the_awaiting_task_cancels_the_batch_under_asyncio(daemon: DaemonProcess) -> None:
    marker = f"36{uuid.uuid4().int % 10**6:06d}"

    async def main() -> p.BatchStatus:
        async with AsyncClient(daemon.endpoint) as client:
            task = asyncio.create_task(client.call("shell", {"command": f"sleep {marker}"}))
            await asyncio.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            batches = await client.list_batches(limit=1)
            return await _settled(client, batches[0].batch_id, asyncio.sleep)

    status = asyncio.run(main())
    assert status.state == "cancelled"
    assert gone(marker)


async def test_without_cancel_on_abandon_the_batch_runs_on(daemon: DaemonProcess) -> None:
    async with AsyncClient(daemon.endpoint) as client:
        with trio.move_on_after(0.3):
            await client.submit(
                [{"name": "shell", "arguments": {"command": "sleep 1; echo done"}}], cancel_on_abandon=False
            )
        batch_id = (await client.list_batches(limit=1))[0].batch_id
        finished = await client.wait_batch(batch_id, timeout=10)
    assert finished.state == "finished" and finished.results[0].content.startswith("done\n")


async def test_a_vanished_daemon_is_an_error_not_a_hang(tmp_path: Path) -> None:
    from tests.conftest import start_daemon
    from toold_client import DaemonUnavailable

    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=CONFIG)
    async with AsyncClient(d.endpoint) as client:
        await client.ping()
        threading.Timer(0.5, d.proc.kill).start()
        with trio.fail_after(10), pytest.raises(DaemonUnavailable):
            await client.call("shell", {"command": "sleep 30"})


async def test_a_daemon_stopped_between_two_calls_is_an_error_at_the_next(tmp_path: Path) -> None:
    from tests.conftest import start_daemon
    from toold_client import DaemonUnavailable

    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        async with AsyncClient(d.endpoint, timeout=30) as client:
            await client.ping()
            d.stop()
            await trio.sleep(0.2)  # the connection's end reaches the client
            with trio.fail_after(1), pytest.raises(DaemonUnavailable, match="no daemon"):
                await client.call("read_file", {"path": "x.txt"})
    finally:
        d.stop()


def gone(marker: str, within: float = 5.0) -> bool:
    """The command's processes are gone (killing the group follows the cancel closely)."""
    deadline = time.monotonic() + within
    while alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive_with(marker) == []


async def _settled(client: AsyncClient, batch_id: str, sleep: Any) -> p.BatchStatus:
    for _ in range(100):
        status = await client.get_batch(batch_id)
        if status.state in ("cancelled", "finished"):
            return status
        await sleep(0.05)
    return status


async def test_a_send_by_one_task_never_strands_the_reading_task(daemon: DaemonProcess) -> None:
    """A send may take ZeroMQ's edge-triggered readiness for a frame that arrived
    meanwhile; the task reading must still hear of it (it is woken after every send)."""
    async with AsyncClient(daemon.endpoint, timeout=10) as client:

        async def reader_and_senders(n: int) -> None:
            for _ in range(40):
                await client.call("read_file", {"path": "hello.txt"}, timeout=10)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for n in range(12):
                    nursery.start_soon(reader_and_senders, n)


def test_a_send_by_one_task_never_strands_the_reading_task_under_asyncio(daemon: DaemonProcess) -> None:
    async def main() -> None:
        async with AsyncClient(daemon.endpoint, timeout=10) as client:

            async def forty() -> None:
                for _ in range(40):
                    await client.call("read_file", {"path": "hello.txt"}, timeout=10)

            async with asyncio.timeout(60):
                await asyncio.gather(*(forty() for _ in range(12)))

    asyncio.run(main())


WORKSPACE_CONFIG = """
[daemon]
max_batches_per_session = 64

[tools.sandbox]
allowed_roots = ["{shared}"]
"""


@pytest.fixture(scope="module")
def workspace_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    shared = tmp_path_factory.mktemp("workspaces")
    with module_daemon(tmp_path_factory, "async-hello", WORKSPACE_CONFIG.format(shared=shared)) as d:
        yield d, shared


async def first_calls_at_once(endpoint: str, workspace: Path, spawn: Any) -> list[bool]:
    """32 tasks make their first call together on a new client for a workspace; returns
    whether each succeeded, then how many hellos the client sent."""
    from toold_client import _async_client

    results: list[bool] = []
    sent = 0
    real_hello = _async_client.requests.hello

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        return real_hello(*args, **kwargs)

    _async_client.requests.hello = counted  # type: ignore[assignment]
    try:
        async with AsyncClient(endpoint, workspace=workspace, timeout=30) as client:

            async def one() -> None:
                results.append((await client.call("list_directory", {"path": "."})).ok)

            await spawn([one for _ in range(32)])
    finally:
        _async_client.requests.hello = real_hello  # type: ignore[assignment]
    return [*results, sent == 1]


def test_many_first_calls_share_one_hello_under_trio(workspace_daemon: tuple[DaemonProcess, Path]) -> None:
    daemon, shared = workspace_daemon

    async def spawn(tasks: list[Any]) -> None:
        async with trio.open_nursery() as nursery:
            for task in tasks:
                nursery.start_soon(task)

    for run in range(25):  # a fresh workspace (and worker) each: the race is there every run
        workspace = shared / f"t{run}"
        workspace.mkdir()
        assert (
            trio.run(first_calls_at_once, daemon.endpoint, workspace, spawn) == [True] * 33
        )  # every call, and one hello


def test_many_first_calls_share_one_hello_under_asyncio(workspace_daemon: tuple[DaemonProcess, Path]) -> None:
    daemon, shared = workspace_daemon

    async def spawn(tasks: list[Any]) -> None:
        await asyncio.gather(*(task() for task in tasks))

    for run in range(25):  # a fresh workspace (and worker) each: the race is there every run
        workspace = shared / f"a{run}"
        workspace.mkdir()
        assert (
            asyncio.run(first_calls_at_once(daemon.endpoint, workspace, spawn)) == [True] * 33
        )  # every call, and one hello
