"""The MCP gateway: third-party stdio MCP servers whose tools join the registry.

One instance of a server runs per (server, uid, gid, workspace roots): started on first
use by the spawner as the requesting user, confined like a command (Landlock to the
workspace, the server's ``read_paths`` and the system; scrubbed environment; no network
unless ``network = true``; its own cgroup), restarted when a call finds it dead, stopped
after ``[mcp] idle_seconds`` without calls and at shutdown. Discovery (initialize,
``tools/list``) happens on the first tool listing or call that needs it, with that
session's identity and workspace; the tools it finds are registered for everyone, each
call then going to the caller's own instance. A server that fails to start or answers
garbage fails the calls that needed it, with its reason and the tail of its stderr, and
is tried again later; it never takes the daemon down.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import trio

from toold_protocol import Identity, ToolErrorType

from .. import __version__
from ..config import McpConfig, McpServerConfig
from ..errors import ToolError
from ..isolation.runner import SpawnRunner, StdioChild
from ..pool_shares import per_uid_share
from ..sandbox import Sandbox
from ..sandbox.environment import DEFAULT_PATH, acceptable
from ..tools._base import Command, Tool, ToolContext, ToolOutput
from ..tools.registry import Registry
from .connection import Connection, ServerBroken, ServerError
from .tools import McpTool, output_of, qualified, server_of, tools_of

log = logging.getLogger(__name__)
PROTOCOL_VERSION = "2025-06-18"
STDERR_TAIL_BYTES = 4096
RETRY_AFTER_SECONDS = 30.0  # a server that failed discovery is not tried again sooner
MAX_PAGES = 20

Key = tuple[str, int, int, tuple[str, ...]]


class Instance(msgspec.Struct, eq=False):
    """One running server for one user and workspace."""

    server: McpServerConfig
    identity: Identity
    sandbox: Sandbox
    process: StdioChild
    connection: Connection
    streams: list[Any]  # what to close when it stops (its socket and stderr streams)
    stderr_tail: bytearray = msgspec.field(default_factory=bytearray)
    last_used: float = msgspec.field(default_factory=trio.current_time)
    in_flight: int = 0
    progress: dict[str, ToolContext] = msgspec.field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return not self.connection.broken

    def why_gone(self) -> str:
        tail = bytes(self.stderr_tail).decode("utf-8", "replace").strip()
        why = self.connection.broken or "it stopped"
        return f"{why}; its stderr ends: {tail[-800:]}" if tail else why


class Gateway:
    def __init__(self, config: McpConfig, runner: SpawnRunner, registry: Registry) -> None:
        self.config = config
        self.servers = {server.name: server for server in config.servers}
        self._runner = runner
        self._registry = registry
        self._instances: dict[Key, Instance] = {}
        self._starting: dict[Key, trio.Lock] = {}
        self._coming: dict[int, int] = {}  # uid -> its instances being started
        self._discovered: set[str] = set()
        self._stale: set[str] = set()  # the server said its tool list changed
        self._failed_at: dict[str, float] = {}
        self.problems: dict[str, str] = {}  # server -> what went wrong last (doctor, logs)
        self._nursery: trio.Nursery | None = None

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def serves(self, tool: Tool[Any]) -> bool:
        return isinstance(tool, McpTool)

    # -- discovery -------------------------------------------------------------------

    def needs_discovery(self, names: list[str] | None = None) -> bool:
        """Whether a listing (``names`` None) or a call to one of ``names`` must first
        learn a server's tools."""
        wanted = self.servers if names is None else {s for n in names if (s := server_of(n)) in self.servers}
        return any(self._due(server) for server in wanted)

    def _due(self, server: str) -> bool:
        if server in self._discovered and server not in self._stale:
            return False
        failed = self._failed_at.get(server)
        return failed is None or trio.current_time() - failed >= RETRY_AFTER_SECONDS

    async def discover(self, identity: Identity, sandbox: Sandbox) -> None:
        """Learn the tools of every server that is due, with this caller's instance of it."""
        async with trio.open_nursery() as nursery:
            for name in [n for n in self.servers if self._due(n)]:
                nursery.start_soon(self._discover_one, self.servers[name], identity, sandbox)

    async def _discover_one(self, server: McpServerConfig, identity: Identity, sandbox: Sandbox) -> None:
        try:
            instance = await self._instance(server, identity, sandbox)
            listed = await self._list_tools(instance)
        except ToolError as exc:
            if exc.code == "LIMITS_EXCEEDED":  # no room for this caller's instance now: not the server's
                log.info("MCP server %s: tools not listed for uid %d now: %s", server.name, identity.uid, exc.message)
                self._registry.note_unlisted(qualified(server.name, ""), identity.uid, exc.message)
                return  # fault, so nobody else's listing waits for a retry; the next call tries again
            self._failed_at[server.name] = trio.current_time()
            self.problems[server.name] = exc.message
            log.warning("MCP server %s: %s", server.name, exc.message)
            return
        found = tools_of(server, listed)
        for old in [t for t in self._registry.list() if isinstance(t, McpTool) and t.server.name == server.name]:
            self._registry.unregister(old.name)
        for tool_class in found.tools:
            self._registry.register(tool_class(), replace=True)
        self._registry.forget_unlisted(qualified(server.name, ""))
        self._discovered.add(server.name)
        self._stale.discard(server.name)
        self._failed_at.pop(server.name, None)
        skipped = f"; refused {len(found.skipped)}: {'; '.join(found.skipped[:5])}" if found.skipped else ""
        self.problems[server.name] = skipped.removeprefix("; ")
        log.info("MCP server %s: %d tools%s", server.name, len(found.tools), skipped)

    async def _list_tools(self, instance: Instance) -> list[Any]:
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            params = {"cursor": cursor} if cursor else {}
            result = await self._ask(instance, "tools/list", params, instance.server.start_timeout_seconds)
            page = result.get("tools")
            listed += page if isinstance(page, list) else []
            next_cursor = result.get("nextCursor")
            if not isinstance(next_cursor, str) or not next_cursor:
                break
            cursor = next_cursor
        return listed

    # -- calls ----------------------------------------------------------------------

    async def call(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> ToolOutput:
        assert isinstance(tool, McpTool)
        instance = await self._instance(tool.server, identity, ctx.sandbox)
        token = f"toold-{ctx.call_id}"
        instance.in_flight += 1
        instance.progress[token] = ctx
        try:
            params = {"name": tool.remote_name, "arguments": args, "_meta": {"progressToken": token}}
            result = await self._ask(instance, "tools/call", params, math.inf)
        finally:
            instance.in_flight -= 1
            instance.progress.pop(token, None)
            instance.last_used = trio.current_time()
        return output_of(result)

    async def _ask(self, instance: Instance, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        name = instance.server.name
        try:
            return await instance.connection.request(method, params, timeout=timeout)
        except ServerError as exc:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED, "MCP_ERROR", f"the MCP server {name!r} refused {method}: {exc.message}"
            ) from None
        except ServerBroken:
            await trio.sleep(0.05)  # let the stderr reader catch the last words
            why = instance.why_gone()
            self.problems[name] = why
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED, "MCP_SERVER_FAILED", f"the MCP server {name!r} failed: {why}"
            ) from None
        except trio.TooSlowError:
            raise ToolError(
                ToolErrorType.TIMEOUT, "MCP_SERVER_SLOW", f"the MCP server {name!r} did not answer {method} in time"
            ) from None

    # -- instances ------------------------------------------------------------------

    async def _instance(self, server: McpServerConfig, identity: Identity, sandbox: Sandbox) -> Instance:
        """The caller's running instance of ``server``, started (or restarted) if needed."""
        key: Key = (server.name, identity.uid, identity.gid, tuple(str(r) for r in sandbox.roots))
        lock = self._starting.setdefault(key, trio.Lock())
        async with lock:
            instance = self._instances.get(key)
            if instance is not None and instance.alive:
                instance.last_used = trio.current_time()
                return instance
            if instance is not None:
                log.warning(
                    "MCP server %s (uid %d) stopped: %s; restarting", server.name, identity.uid, instance.why_gone()
                )
                await self._stop(key)
            await self._make_room(identity.uid)
            self._coming[identity.uid] = self._coming.get(identity.uid, 0) + 1  # counted while it starts
            try:
                instance = await self._start(server, identity, sandbox)
                self._instances[key] = instance
            finally:
                self._coming[identity.uid] -= 1
            return instance

    async def _make_room(self, uid: int) -> None:
        """Room for one more instance of ``uid``'s: past its share, by stopping one of its
        own idle ones (never another user's); past the pool, the least recently used idle.
        Instances still starting count; each stop is awaited, so the counts are read again."""
        share = per_uid_share(self.config.max_instances, self.config.max_instances_per_uid)
        while True:
            own = [(i.last_used, k) for k, i in self._instances.items() if k[1] == uid]
            if len(own) + self._coming.get(uid, 0) >= share:
                own_idle = [(used, k) for used, k in own if self._instances[k].in_flight == 0]
                if not own_idle:
                    raise ToolError(
                        ToolErrorType.SANDBOX_VIOLATION,
                        "LIMITS_EXCEEDED",
                        f"this user's {len(own) + self._coming.get(uid, 0)} MCP server instances are all busy "
                        "([mcp] max_instances_per_uid)",
                    )
                await self._stop(min(own_idle)[1])
                continue
            if len(self._instances) + sum(self._coming.values()) < self.config.max_instances:
                return
            idle = [(i.last_used, k) for k, i in self._instances.items() if i.in_flight == 0]
            if not idle:
                raise ToolError(
                    ToolErrorType.SANDBOX_VIOLATION,
                    "LIMITS_EXCEEDED",
                    f"{len(self._instances)} MCP server instances are busy ([mcp] max_instances)",
                )
            await self._stop(min(idle)[1])

    async def _start(self, server: McpServerConfig, identity: Identity, sandbox: Sandbox) -> Instance:
        assert self._nursery is not None
        workspace = str(sandbox.working_dir)
        program = server.command if server.command.startswith("/") else shutil.which(server.command, path=DEFAULT_PATH)
        if program is None:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "MCP_SERVER_FAILED",
                f"the MCP server {server.name!r} could not start: {server.command} is not on {DEFAULT_PATH}",
            )
        command = Command(
            argv=[program, *(a.replace("{workspace}", workspace) for a in server.args)],
            cwd=workspace,
            network=server.network,
            env={k: v.replace("{workspace}", workspace) for k, v in acceptable(server.env).items()},
        )
        process = await self._runner.start_stdio(
            f"mcp:{server.name}", identity, sandbox, command, [os.path.realpath(p) for p in server.read_paths]
        )
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(process.channel))
        stderr = trio.lowlevel.FdStream(process.stderr)
        holder: list[Instance] = []
        connection = Connection(
            stream,
            on_request=lambda method, params: _answer_server(sandbox, method),
            on_notification=lambda method, params: self._notified(holder, method, params),
        )
        instance = Instance(server, identity, sandbox, process, connection, [stream, stderr])
        holder.append(instance)
        self._nursery.start_soon(connection.read_forever)
        self._nursery.start_soon(_keep_tail, stderr, instance.stderr_tail)
        try:
            await self._ask(
                instance,
                "initialize",
                {
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {"roots": {"listChanged": False}},
                    "clientInfo": {"name": "toold", "version": __version__},
                },
                server.start_timeout_seconds,
            )
            await instance.connection.notify("notifications/initialized")
        except (ToolError, ServerBroken) as exc:
            await self._close(instance)
            message = exc.message if isinstance(exc, ToolError) else instance.why_gone()
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "MCP_SERVER_FAILED",
                f"the MCP server {server.name!r} could not start: {message}",
            ) from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._close(instance)
            raise
        log.info("MCP server %s started for uid %d in %s (pid %d)", server.name, identity.uid, workspace, process.pid)
        return instance

    def _notified(self, holder: list[Instance], method: str, params: dict[str, Any]) -> None:
        if not holder:
            return
        instance = holder[0]
        if method == "notifications/tools/list_changed":
            self._stale.add(instance.server.name)
        elif method == "notifications/progress":
            ctx = instance.progress.get(str(params.get("progressToken")))
            if ctx is not None and ctx.emit is not None:
                ctx.emit("stderr", _progress_line(params))

    async def retire_idle_forever(self) -> None:
        """Stop instances nobody called for ``idle_seconds`` (and dead ones)."""
        idle = self.config.idle_seconds
        while True:
            await trio.sleep(min(idle / 2, 30.0))
            now = trio.current_time()
            for key, instance in list(self._instances.items()):
                if instance.in_flight == 0 and (now - instance.last_used >= idle or not instance.alive):
                    await self._stop(key)

    async def _stop(self, key: Key) -> None:
        instance = self._instances.pop(key, None)
        if instance is not None:
            await self._close(instance)

    async def _close(self, instance: Instance) -> None:
        with trio.CancelScope(shield=True):
            instance.connection.fail("stopped by the daemon")
            for stream in instance.streams:
                await stream.aclose()
            await self._runner.stop_stdio(instance.process)

    async def close(self) -> None:
        """Stop every instance (shutdown)."""
        for key in list(self._instances):
            await self._stop(key)

    def running(self) -> Iterator[tuple[str, int, int]]:
        """(server, uid, pid) of each running instance."""
        for instance in self._instances.values():
            yield instance.server.name, instance.identity.uid, instance.process.pid


async def _answer_server(sandbox: Sandbox, method: str) -> dict[str, Any] | None:
    """What the gateway answers a server's own requests: its workspace as the roots."""
    if method == "ping":
        return {}
    if method == "roots/list":
        return {"roots": [{"uri": Path(root).as_uri(), "name": Path(root).name or "/"} for root in sandbox.roots]}
    return None


async def _keep_tail(stderr: trio.lowlevel.FdStream, tail: bytearray) -> None:
    """Drain a server's stderr (so it never blocks on a full pipe), keeping its end."""
    try:
        while data := await stderr.receive_some(65536):
            tail += data
            del tail[:-STDERR_TAIL_BYTES]
    except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        pass


def _progress_line(params: dict[str, Any]) -> str:
    progress, total, message = params.get("progress"), params.get("total"), params.get("message")
    shown = f"{progress}/{total}" if total is not None else f"{progress}"
    text = f"[progress {shown}{': ' + str(message)[:200] if message else ''}]"
    return text.replace("\n", " ") + "\n"


async def trial(config: McpConfig, runner: SpawnRunner, identity: Identity, sandbox: Sandbox) -> dict[str, str]:
    """Start every configured server once, as ``identity`` in ``sandbox``, and list its
    tools (``toold doctor``): server -> "" and its tool count, or what went wrong."""
    registry = Registry()
    gateway = Gateway(config, runner, registry)
    async with trio.open_nursery() as nursery:
        gateway.bind_nursery(nursery)
        runner.bind_nursery(nursery)
        await gateway.discover(identity, sandbox)
        await gateway.close()
        nursery.cancel_scope.cancel()
    counts = {name: 0 for name in gateway.servers}
    for tool in registry.list():
        if isinstance(tool, McpTool):
            counts[tool.server.name] += 1
    return {
        name: (f"{counts[name]} tools" if name in gateway._discovered else "")
        + (f"; {gateway.problems[name]}" if gateway.problems.get(name) else "")
        for name in gateway.servers
    }
