"""``SpawnRunner``: the trio side of isolated execution (the executor's ToolRunner).

Per call: make a private temp dir, build the request (sanitized environment, limits,
identity, roots), hand the spawner the write end of a fresh channel pipe, then read
frames from the read end until the child's ``Outcome`` or end of file. Whatever ends
the call (outcome, timeout, cancel, crash), the whole process group and every escaped
descendant are killed before the runner returns, and the temp dir is removed.

Python tools (reads included, whoever the client is) run in tool workers (``workers``):
confined like a command, kept warm, one frame each way per call. Commands run through a
zygote (``zygotes``) or a fresh child.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import signal
import socket
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from toold_protocol import Identity, IsolationLayer, ToolErrorType

from ..config import Config
from ..egress.calls import EgressCall, EgressCalls, record_data
from ..egress.rules import EgressRules
from ..errors import ToolError
from ..execution.results import OUTPUT_DETAILS
from ..output import Unseen
from ..sandbox import Sandbox
from ..sandbox.environment import acceptable, inherited_environment, is_injection
from ..tools._base import Command, Tool, ToolContext, ToolOutput
from . import sweep as sweeping
from .admission import peer_credentials
from .cgroup import Cgroups
from .jobs import Job, Jobs
from .sockets import PeerGone, send_with_fd
from .tempdirs import TempDirs
from .wire import (
    Chunk,
    FrameBuffer,
    Limits,
    Outcome,
    Spawned,
    SpawnRequest,
    TempDone,
    TempWanted,
    child_decoder,
    frame,
)
from .workers import WorkerFailed, Workers, WorkerUnavailable
from .zygotes import CommandNotStarted, Zygotes, ZygoteUnavailable

log = logging.getLogger(__name__)
_spawned_decoder = msgspec.msgpack.Decoder(Spawned)
BACKGROUND_TIMEOUT_S = 3600.0  # a background job without timeout_ms is killed after an hour
STALE_CGROUP_TRIES = 60
SPAWNER_SILENT_SECONDS = 10.0  # the spawner answers in milliseconds; past this a caller stops waiting
_encoder = msgspec.msgpack.Encoder()


class ChildFailed(ToolError):
    pass


@dataclass(frozen=True, slots=True)
class _Child:
    """A started child: whoever holds this must kill it (by pid and token) and remove temp."""

    pid: int
    read_end: int
    token: str
    temp: str
    uid: int
    cgroup: str  # its call cgroup's name ("" without one)
    zygote_left: trio.Event | None = None  # set once the zygote that started it left its cgroup


@dataclass(frozen=True, slots=True)
class StdioChild:
    """A long-lived confined program: its stdio socket and the read end of its stderr."""

    child: _Child
    channel: socket.socket
    stderr: int

    @property
    def pid(self) -> int:
        return self.child.pid


class SpawnRunner:
    def __init__(self, spawner_pid: int, control: socket.socket, config: Config) -> None:
        self.spawner_pid = spawner_pid
        self._control = trio.socket.from_stdlib_socket(control)
        self._lock = trio.Lock()
        self._replies = FrameBuffer()  # what the spawner sent and no exchange has read yet
        self._owed: list[str] = []  # call tokens of requests whose callers gave up waiting
        self._euid = peer_credentials(control)[1]  # the spawner's: it acts for anyone when root
        self.config = config
        self._config_bytes = _encoder.encode(config)
        # The daemon's environment is read once: filtering it per call cost ~0.1 ms.
        environment = config.tools.environment
        self._inherited_env = inherited_environment(os.environ, allow=environment.allowlist, deny=environment.denylist)
        # The search key is the administrator's, whatever its name or the allowlist says.
        self._inherited_env.pop(config.tools.web_search.api_key_env, None)
        isolation = config.tools.isolation
        self._limits = Limits(
            cpu_seconds=isolation.cpu_seconds,
            address_space_bytes=isolation.address_space_mb * 1024 * 1024,
            file_size_bytes=isolation.file_size_mb * 1024 * 1024,
            open_files=isolation.open_files,
            processes=isolation.processes,
        )
        self.layers: dict[str, str] = {}
        self.jobs = Jobs()
        self.user_state: Any = None  # memory and todos (``UserState``), set by the server
        network = config.tools.network
        self._egress_rules = EgressRules.of(
            allowed_domains=network.allowed_domains,
            denied_domains=network.denied_domains,
            allowed_ports=network.allowed_ports,
            allowed_networks=network.allowed_networks,
        )
        self.egress = EgressCalls(self._decide_egress)
        #: The service's own groups (the socket's, the service user's): never a tool's.
        self.service_gids: frozenset[int] = frozenset()
        self.gateway: Any = None  # third-party MCP servers (``mcp.Gateway``), set by the server
        self.cgroups = Cgroups.detect(config.tools.isolation.cgroups)
        # None: the spawner's (see temps_from_spawner); a spawner of its own always makes them.
        self._temps: TempDirs | None = TempDirs(self._euid) if self._euid == os.geteuid() else None
        self._zygotes = (
            Zygotes(self._ask_spawner, self.cgroups, isolation.processes, isolation.address_space_mb * 1024 * 1024)
            if isolation.zygotes
            else None
        )
        self.workers = Workers(
            self._ask_spawner,
            self.cgroups,
            pids_max=isolation.processes,
            memory_max=isolation.address_space_mb * 1024 * 1024,
            max_workers=isolation.max_workers,
            idle_seconds=isolation.worker_idle_seconds,
        )
        self._nursery: trio.Nursery | None = None

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        """Where background jobs are followed; cancelling it (shutdown) kills them all."""
        self._nursery = nursery
        if self._zygotes is not None:
            self._zygotes.nursery = nursery
            self._zygotes.on_egress = lambda link: nursery.start_soon(self.egress.serve, link)
        if self.cgroups.stale:
            nursery.start_soon(self._remove_stale_cgroups)

    async def _remove_stale_cgroups(self) -> None:
        """Dead daemons' cgroups whose last processes were still exiting at start: tried
        again every second for a minute, then left (with a warning) to the next start."""
        for _ in range(STALE_CGROUP_TRIES):
            await trio.sleep(1.0)
            if self.cgroups.remove_stale_again():
                return
        log.warning("could not remove cgroups of a killed daemon (still busy): %s", ", ".join(self.cgroups.stale))

    @property
    def zygotes_alive(self) -> int:
        return len(self._zygotes) if self._zygotes is not None else 0

    @property
    def isolation(self) -> list[IsolationLayer]:
        return [
            IsolationLayer(
                name="process",
                available=True,
                detail="every tool runs in a confined process as the client: Python tools in "
                "long-lived workers, each command in its own process group and cgroup",
            ),
            *(
                IsolationLayer(name=name, available=state.startswith("on"), detail=state)
                for name, state in sorted(self.layers.items())
            ),
        ]

    async def probe(self, tool: Tool[Any]) -> dict[str, str]:
        """Run ``tool`` (a no-op) in a child with the network cut, to learn which layers the
        kernel grants; the answer goes into ``welcome`` and ``toold doctor``."""
        ctx = ToolContext(call_id="probe", sandbox=None, config=self.config)  # type: ignore[arg-type]
        me = Identity(uid=self._euid, gid=os.getegid(), pid=os.getpid())
        outcome = await self._spawn(tool, tool.args_type(), ctx, me, probe=True)
        self.layers = dict(outcome.layers)
        if self.layers.get("cgroup", "").startswith("on") or not self.cgroups.base:
            self.layers["cgroup"] = self.cgroups.describe()
        return self.layers

    async def run(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> ToolOutput:
        if self.gateway is not None and self.gateway.serves(tool):
            output: ToolOutput = await self.gateway.call(tool, args, ctx, identity)
            return output
        if tool.runs_in_daemon(self.config):
            ctx.jobs, ctx.identity, ctx.user_state = self.jobs, identity, self.user_state
            return await trio.to_thread.run_sync(tool.run, args, ctx)
        command = tool.command(args, ctx)
        if command is not None and command.background:
            return await self._start_background(tool, args, ctx, identity, command)
        if command is None and tool.network:
            outcome = await self._spawn(tool, args, ctx, identity)  # a fresh child, network open
        elif command is None:
            outcome = await self._in_worker(tool, args, ctx, identity)
        else:
            outcome = await self._spawn(tool, args, ctx, identity, command=command)
        _raise_for(outcome)
        return ToolOutput(
            outcome.content,
            outcome.display,
            outcome.data,
            outcome.allow_truncation,
            outcome.records,
            tail=outcome.tail,
            unseen=Unseen(outcome.unseen_bytes, outcome.unseen_lines),
            changes=list(outcome.changes),
        )

    async def preview(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> str | None:
        """The call's diff preview, computed in a worker with the client's privileges; a
        call that would fail raises its error (the request then shows why)."""
        outcome = await self._in_worker(tool, args, ctx, identity, preview=True)
        _raise_for(outcome)
        return outcome.content or None

    async def _in_worker(
        self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity, *, preview: bool = False
    ) -> Outcome:
        """One Python tool call in a worker of the client's kind. A call that is cancelled
        or times out ends its worker; the partial output says so."""
        self._check_identity(identity)
        request = self._tool_request(tool, args, ctx, identity, preview=preview)

        def on_chunk(chunk: Chunk) -> None:
            ctx.partial.append(chunk.data)
            if ctx.emit is not None:
                ctx.emit(chunk.stream, chunk.data, 1)

        try:
            return await self.workers.run(request, self._config_bytes, on_chunk)
        except WorkerFailed as exc:
            raise ChildFailed(ToolErrorType.EXECUTION_FAILED, "WORKER_DIED", f"Tool failed: {exc}") from None
        except WorkerUnavailable as exc:
            raise ToolError(ToolErrorType.ISOLATION_UNAVAILABLE, "ISOLATION_UNAVAILABLE", str(exc)) from None
        except trio.Cancelled:
            ctx.partial.append("\n[toold: the call's worker was stopped; the next call gets a fresh one]\n")
            raise

    async def open_workspace(self, identity: Identity, sandbox: Sandbox) -> list[str]:
        """Start (or find) the client's worker for ``sandbox``'s roots: it opens each root
        as the client, so a workspace that user cannot read is refused here, with why.
        Returns the roots as the worker's sandbox canonicalised them."""
        self._check_identity(identity)
        ctx = ToolContext(call_id="workspace", sandbox=sandbox, config=self.config)
        request = self._tool_request(None, None, ctx, identity, preview=False)
        try:
            return await self.workers.ensure(request, self._config_bytes)
        except WorkerUnavailable as exc:
            raise ToolError(ToolErrorType.PERMISSION_DENIED, "WORKSPACE_REFUSED", str(exc)) from None

    def _check_identity(self, identity: Identity) -> None:
        if self._euid not in (identity.uid, 0):
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE,
                "ISOLATION_UNAVAILABLE",
                f"this daemon runs as uid {self._euid} and cannot act for uid {identity.uid}",
            )

    async def _start_background(
        self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity, command: Command
    ) -> ToolOutput:
        if self._nursery is None:
            raise ToolError(ToolErrorType.ISOLATION_UNAVAILABLE, "NO_JOBS", "this daemon runs no background jobs")
        child = await self._launch(tool, args, ctx, identity, command=command)
        try:
            job = self.jobs.add(identity.uid, tool.summary(args), child.pid)
        except ValueError as exc:
            os.close(child.read_end)
            await self._kill(child)
            raise ToolError(ToolErrorType.SANDBOX_VIOLATION, "LIMITS_EXCEEDED", str(exc)) from None

        def kill() -> None:  # from shell_jobs' worker thread; the follower then sweeps
            job.state = "killed"  # before the signal: the outcome that follows must not say "exited"
            # the cgroup first: an unprivileged daemon cannot signal another user's group
            if not self.cgroups.kill(child.cgroup):
                _signal_group(child.pid, signal.SIGKILL)

        job.kill = kill
        limit = tool.timeout_seconds(args) or BACKGROUND_TIMEOUT_S
        self._nursery.start_soon(self._follow, job, child, limit)
        return ToolOutput(
            f"started {job.job_id} (pid {child.pid}) in the background; read or kill it with shell_jobs",
            data={"job_id": job.job_id, "pid": child.pid},
        )

    async def _follow(self, job: Job, child: _Child, limit: float) -> None:
        """Read a background job's frames into its bounded buffer until it ends, its time
        limit passes, or the daemon stops; then kill what is left and clean up."""
        keep = self.config.tools.output.max_bytes
        buffer = FrameBuffer()
        try:
            with trio.move_on_after(limit):
                async with trio.lowlevel.FdStream(child.read_end) as stream:
                    while data := await stream.receive_some(65536):
                        for message in _decode_frames(buffer, data):
                            if isinstance(message, Chunk):
                                job.add_output(message.data, keep)
                            elif isinstance(message, Outcome):
                                exit_code = (message.data or {}).get("exit_code")
                                job.exit_code = exit_code if isinstance(exit_code, int) else None
                                if job.state == "running":
                                    job.state = "exited"
        except ChildFailed as exc:  # garbage on the channel: end the job, never the daemon
            job.add_output(f"\n[toold: {exc.message}]\n", keep)
        finally:
            with trio.CancelScope(shield=True):
                await self.egress.forget(child.token)  # its proxy listener goes with it
                await self._kill(child)
            if job.state == "running":
                job.state = "killed"

    async def _spawn(
        self,
        tool: Tool[Any],
        args: Any,
        ctx: ToolContext,
        identity: Identity,
        *,
        command: Command | None = None,
        probe: bool = False,
        preview: bool = False,
    ) -> Outcome:
        """Run one call in a child and return its outcome; the child and everything it
        started are killed, and its temp dir cleared, whatever ends the wait."""
        child = await self._launch(tool, args, ctx, identity, command=command, probe=probe, preview=preview)
        try:
            outcome = await self._collect(child.read_end, ctx)
            records = await self.egress.forget(child.token)
            if records:
                data = {**(outcome.data or {}), "network": record_data(records)}
                outcome = msgspec.structs.replace(outcome, data=data)
            return outcome
        finally:
            with trio.CancelScope(shield=True):
                await self.egress.forget(child.token)
                await self._kill(child)

    async def _launch(
        self,
        tool: Tool[Any],
        args: Any,
        ctx: ToolContext,
        identity: Identity,
        *,
        command: Command | None,
        probe: bool = False,
        preview: bool = False,
    ) -> _Child:
        """Start a child for one call: its token, temp dir, cgroup and channel. On failure
        nothing is left behind; on success the caller owns killing and cleaning up."""
        self._check_identity(identity)
        token = secrets.token_hex(12)
        temp = "" if probe else await self._take_temp(identity)  # the probe writes nothing
        via_zygote = self._zygotes is not None and command is not None and bool(command.argv)
        read_end, write_end = os.pipe()
        try:
            request = self._request(
                tool.name, args, ctx, identity=identity, token=token, temp=temp, command=command, probe=probe
            )
            if preview:
                request = msgspec.structs.replace(request, preview=True)
            if command is not None and command.network:
                request = self._network_mode(tool.name, request)
            left = None
            if self._zygotes is not None and via_zygote:
                pid, group, left = await self._start_command(self._zygotes, request, write_end, ctx)
            else:
                pid, group = await self._fork_with_egress(request, [write_end], ctx)
        except BaseException:
            os.close(read_end)
            with trio.CancelScope(shield=True):
                await self._give_back_temp(temp, identity.uid, reusable=False)
            raise
        finally:
            os.close(write_end)
        return _Child(pid, read_end, token, temp, identity.uid, group, left)

    def _network_mode(self, tool_name: str, request: SpawnRequest) -> SpawnRequest:
        """A command that wants the network gets its tool's mode: the host's network, none,
        or the filtering proxy (an MCP server's ``tool_name`` is ``mcp:NAME``)."""
        network = self.config.tools.network
        mode = network.mode_of(tool_name)
        if mode == "host":
            return request
        proxied = mode == "proxy"
        return msgspec.structs.replace(
            request, network=False, egress_proxy=proxied, egress_budget=network.max_bytes_per_call
        )

    async def _decide_egress(self, call: EgressCall, host: str, port: int) -> tuple[bool, str]:
        """The rules first; a host they neither allow nor deny is the person's to answer."""
        judgement, why, normal = self._egress_rules.judge(host, port)
        if judgement != "ask":
            return judgement == "allow", why
        ask = getattr(call.context, "ask_network", None)
        if ask is None:
            return False, f"{normal} is not in [tools.network] allowed_domains, and nobody can be asked"
        allowed, answer = await ask(normal, port)
        return bool(allowed), str(answer)

    async def start_stdio(
        self, name: str, identity: Identity, sandbox: Sandbox, command: Command, readable: list[str]
    ) -> StdioChild:
        """Start a long-lived program (an MCP server) as ``identity`` in a fresh confined
        child of its own cgroup, speaking on a socket that is its stdin and stdout. The
        caller owns the result: ``stop_stdio`` kills it and cleans up."""
        self._check_identity(identity)
        token = secrets.token_hex(12)
        temp = await self._take_temp(identity)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        err_read, err_write = os.pipe()
        ctx = ToolContext(call_id=f"server-{token}", sandbox=sandbox, config=self.config)
        request = self._request(
            name, None, ctx, identity=identity, token=token, temp=temp, command=command, probe=False
        )
        request = msgspec.structs.replace(request, stdio=True, readable=readable, hidden_patterns=[])
        if command.network:
            request = self._network_mode(name, request)
        try:
            # the server's connections are judged by the rules; nobody is asked for a server
            pid, group = await self._fork_with_egress(request, [theirs.fileno(), err_write], ctx)
        except BaseException:
            ours.close()
            os.close(err_read)
            with trio.CancelScope(shield=True):
                await self._give_back_temp(temp, identity.uid, reusable=False)
            raise
        finally:
            theirs.close()
            os.close(err_write)
        return StdioChild(_Child(pid, -1, token, temp, identity.uid, group), ours, err_read)

    async def stop_stdio(self, started: StdioChild) -> None:
        """Kill a program ``start_stdio`` started, everything it started, and clean up."""
        started.channel.close()
        with trio.CancelScope(shield=True):
            await self.egress.forget(started.child.token)
            await self._kill(started.child)

    async def _fork_with_egress(self, request: SpawnRequest, fds: list[int], ctx: ToolContext) -> tuple[int, str]:
        """A fresh child (not a zygote); in proxy mode with one more fd, the link its
        egress process talks to the daemon on, served and registered for the call."""
        if not request.egress_proxy or self._nursery is None:
            return await self._fork_child(msgspec.structs.replace(request, egress_proxy=False), fds)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            started = await self._fork_child(request, [*fds, theirs.fileno()])
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        link = trio.socket.from_stdlib_socket(ours)
        self._nursery.start_soon(self.egress.serve, link)
        self.egress.register(request.token, link, ctx)
        return started

    async def _fork_child(self, request: SpawnRequest, write_end: int | list[int]) -> tuple[int, str]:
        """A fresh child from the spawner, which joins a new call cgroup first thing:
        (pid, the cgroup's name or "")."""
        isolation = self.config.tools.isolation
        group = self.cgroups.create(
            f"call-{request.token}", pids_max=isolation.processes, memory_max=isolation.address_space_mb * 1024 * 1024
        )
        try:
            pid = await self._ask_spawner(
                msgspec.structs.replace(request, cgroups=self.cgroups.paths(group)), write_end
            )
        except BaseException:
            self.cgroups.remove(group)
            raise
        return pid, group

    async def _start_command(
        self, zygotes: Zygotes, request: SpawnRequest, write_end: int, ctx: ToolContext
    ) -> tuple[int, str, trio.Event | None]:
        """Through the zygote of the call's kind (a posix_spawn, in the cgroup the zygote
        prepared); should that fail, through a fresh child as before, after sweeping
        anything a dying zygote may have started: (pid, the call's cgroup)."""
        try:
            started = await zygotes.spawn(request, write_end)
            link = zygotes.egress_of(request) if request.egress_proxy else None
            if link is not None:  # the zygote's egress process serves the command
                self.egress.register(request.token, link, ctx)
            return started
        except CommandNotStarted as exc:
            log.debug("zygote could not start %s (%s); a fresh child will say why", request.argv[:1], exc)
        except ZygoteUnavailable as exc:
            log.warning("zygote unavailable (%s); starting a fresh child", exc)
            sweeping.sweep(self.spawner_pid, 0, request.token)
        pid, group = await self._fork_with_egress(request, [write_end], ctx)
        return pid, group, None

    def _request(
        self,
        tool_name: str,
        args: Any,
        ctx: ToolContext,
        *,
        identity: Identity,
        token: str,
        temp: str,
        command: Command | None,
        probe: bool,
    ) -> SpawnRequest:
        isolation = self.config.tools.isolation
        home, user = _home_and_user(identity.uid)
        env = {
            **self._inherited_env,
            **acceptable(
                {"HOME": home, "USER": user, "LOGNAME": user, "TMPDIR": temp},
                deny=self.config.tools.environment.denylist,
            ),
        }
        # The call's own variables: chosen by the caller, so a name like MY_TOKEN is theirs
        # to pass; only injection hooks (LD_PRELOAD, BASH_ENV, ...) are refused.
        env.update({k: v for k, v in (command.env if command else {}).items() if not is_injection(k)})
        env[sweeping.TOKEN_VARIABLE] = token  # set last: the sweep depends on it
        argv = [a.replace("{tmp}", temp) for a in command.argv] if command else []
        limits = self._limits
        roots = [] if probe else [str(r) for r in ctx.sandbox.roots]
        return SpawnRequest(
            drop_groups=sorted(self.service_gids),
            call_id=ctx.call_id,
            token=token,
            tool=tool_name,
            args=_encoder.encode(args),
            config=self._config_bytes,
            roots=roots,
            resolved={k: str(v) for k, v in ctx.resolved.items()},
            argv=argv,
            cwd=command.cwd if command else "",
            env=env,
            files=dict(command.files) if command else {},
            uid=identity.uid,
            gid=identity.gid,
            network=command.network if command else not probe,
            network_namespace=isolation.network_namespace,
            writable=[os.path.dirname(temp)] if temp else [],  # the uid's own temp base
            temp=temp,
            limits=limits,
            idle_timeout_s=command.idle_timeout_s if command else 0.0,
            narrow_reads=command.narrow_reads if command else False,
            stream_limit_bytes=isolation.stream_limit_bytes,
            keep_bytes=self.config.tools.output.max_bytes,
            require=[] if probe else list(isolation.require),
            keep_capabilities=list(isolation.keep_capabilities),
            readonly_paths=[
                os.path.join(root, name) for root in roots for name in self.config.tools.sandbox.readonly_for_commands
            ]
            if command
            else [],
            hidden_patterns=list(ctx.sandbox.denied_patterns)
            if command and self.config.tools.sandbox.hide_denied_from_commands
            else [],
            protected_patterns=list(ctx.sandbox.protected_patterns) if command else [],
            protect_homes=bool(command) and ctx.sandbox.protect_homes,
            hide_max_entries=self.config.tools.sandbox.hide_denied_max_entries,
            reads=dict(ctx.reads),
            umask=ctx.umask,
        )

    def _tool_request(
        self, tool: Tool[Any] | None, args: Any, ctx: ToolContext, identity: Identity, *, preview: bool
    ) -> SpawnRequest:
        """A Python tool call for a worker: what the call needs, and what the worker's kind
        and confinement are made of (used when a new worker starts)."""
        isolation = self.config.tools.isolation
        return SpawnRequest(
            drop_groups=sorted(self.service_gids),
            call_id=ctx.call_id,
            token="",
            tool=tool.name if tool is not None else "",
            args=_encoder.encode(args) if tool is not None else b"",
            roots=[str(r) for r in ctx.sandbox.roots],
            resolved={k: str(v) for k, v in ctx.resolved.items()},
            reads=dict(ctx.reads),
            uid=identity.uid,
            gid=identity.gid,
            network=False,
            network_namespace=isolation.network_namespace,
            limits=self._limits,
            require=list(isolation.require),
            preview=preview,
            undo_budget=ctx.undo_budget,
            umask=ctx.umask,
            blobs=ctx.blobs,
        )

    def temps_from_spawner(self) -> None:
        """From now on the spawner makes and takes back the calls' temp dirs: this process
        is about to give up the privileges that chown them (``privileges``)."""
        if self._temps is not None:
            self._temps.close()
            self._temps = None

    async def _take_temp(self, identity: Identity) -> str:
        """A private temp dir of the client's uid: made here while this process may chown
        (no round trip on the call's path), else by the spawner."""
        if self._temps is not None:
            return self._temps.take(identity.uid, identity.gid)
        reply = await self._chore(TempWanted(uid=identity.uid, gid=identity.gid))
        if reply.error or not reply.path:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE, "NO_TEMP_DIR", f"no temp dir for the call: {reply.error}"
            )
        return reply.path

    async def _give_back_temp(self, temp: str, uid: int, *, reusable: bool) -> None:
        if not temp:
            return
        if self._temps is not None:
            self._temps.give_back(temp, uid, reusable=reusable)
        else:
            await self._chore(TempDone(path=temp, reusable=reusable))

    async def _chore(self, message: TempWanted | TempDone) -> Spawned:
        """One request to the spawner without an fd; an exited spawner is an error reply."""
        try:
            return await self._exchange(frame(message), None)
        except (PeerGone, OSError):
            return Spawned(error="the spawner process has exited")
        except trio.TooSlowError:
            return Spawned(error=f"the spawner did not answer within {SPAWNER_SILENT_SECONDS:g} s")

    async def _ask_spawner(self, request: SpawnRequest, channel_write_end: int | list[int]) -> int:
        try:
            reply = await self._exchange(frame(request), channel_write_end, token=request.token)
        except (PeerGone, OSError):
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE, "SPAWNER_GONE", "the spawner process has exited"
            ) from None
        except trio.TooSlowError:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE,
                "SPAWNER_SLOW",
                f"the spawner did not answer within {SPAWNER_SILENT_SECONDS:g} s; try again",
            ) from None
        if reply.error or reply.pid <= 0:
            raise ToolError(
                ToolErrorType.ISOLATION_UNAVAILABLE, "SPAWN_FAILED", f"could not start a child: {reply.error}"
            )
        return reply.pid

    async def _exchange(self, data: bytes, fds: int | list[int] | None, *, token: str = "") -> Spawned:
        """Send one frame to the spawner and read its reply, whole, whatever cancels the
        caller: a request whose reply stayed unread (or half read) would hand every later
        caller the previous one's answer, or a length read from the middle of a frame.

        The spawner answers at once (it only forks), but it is single-threaded: a request
        it is slow to check (a root on a hung mount) holds up everyone's. After
        ``SPAWNER_SILENT_SECONDS`` the caller is told so, and the reply it leaves behind is
        read, before anything is sent, by the next exchange, which also sweeps whatever
        that reply says was started for nobody. A request that cannot even be written
        means the spawner is wedged for good: its channel is closed."""
        reply: Spawned | None = None
        async with self._lock:
            with trio.CancelScope(shield=True):
                with trio.fail_after(SPAWNER_SILENT_SECONDS):
                    await self._read_owed_replies()
                sent = False
                try:
                    with trio.fail_after(SPAWNER_SILENT_SECONDS):
                        if fds is not None:  # (fd 0 is an fd too)
                            await send_with_fd(self._control, data, fds)
                        else:
                            while data:
                                data = data[await self._control.send(data) :]
                        sent = True
                        reply = await self._next_reply()
                except trio.TooSlowError:
                    if not sent:
                        log.error("the spawner takes no requests any more; closing its channel")
                        self._control.close()
                        raise
                    log.warning("the spawner did not answer within %g s", SPAWNER_SILENT_SECONDS)
                    self._owed.append(token)
                    raise
        assert reply is not None
        return reply

    async def _next_reply(self) -> Spawned:
        """The spawner's next reply. Bytes read stay in ``_replies`` if this is cancelled."""
        while (body := self._next_body()) is None:
            data = await self._control.recv(65536)
            if not data:
                raise PeerGone
            self._replies.add(data)
        try:
            return _spawned_decoder.decode(body)
        except msgspec.DecodeError:  # nothing after this can be trusted to be in step
            self._control.close()
            raise PeerGone from None

    def _next_body(self) -> bytes | None:
        try:
            return self._replies.next()
        except ValueError:  # a length over the limit: the channel is out of step for good
            self._control.close()
            raise PeerGone from None

    async def _read_owed_replies(self) -> None:
        """Read the replies of requests whose callers stopped waiting; a command started
        for one of them is swept (its worker or zygote ends by itself: nobody holds the
        other end of its socket)."""
        while self._owed:
            reply = await self._next_reply()
            token = self._owed.pop(0)
            if reply.pid > 0 and token:
                sweeping.sweep(self.spawner_pid, 0, token)

    async def _collect(self, read_end: int, ctx: ToolContext) -> Outcome:
        """Frames until the outcome; streamed text goes to ``ctx.emit`` and (bounded) ``ctx.partial``."""
        buffer = FrameBuffer()
        kept = 0
        keep = self.config.tools.output.max_bytes
        async with trio.lowlevel.FdStream(read_end) as stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                chunks: list[Chunk] = []
                outcome: Outcome | None = None
                for message in _decode_frames(buffer, data):
                    if isinstance(message, Outcome):
                        outcome = message
                        break
                    chunks.append(message)
                for stream_name, text, count in _coalesce(chunks):
                    room = max(0, keep - kept)
                    if room:
                        ctx.partial.append(text[:room])
                        kept += len(text)
                    if len(text) > room:
                        dropped = text[room:]
                        ctx.partial_dropped[0] += len(dropped.encode("utf-8", "surrogatepass"))
                        ctx.partial_dropped[1] += dropped.count("\n")
                    if ctx.emit is not None:
                        ctx.emit(stream_name, text, count)
                if outcome is not None:
                    return outcome
        raise ChildFailed(
            ToolErrorType.EXECUTION_FAILED,
            "CHILD_DIED",
            "Tool failed: the isolated child exited without a result (killed, or out of memory)",
            output="".join(ctx.partial) or None,
        )

    async def _kill(self, child: _Child) -> None:
        """SIGTERM first when a grace period is configured, then SIGKILL to the call's cgroup,
        its group and every escapee carrying its token, until a sweep pass finds nothing new.

        After ``cgroup.kill``, every process of the call has SIGKILL pending, so the token
        sweep (a check behind the cgroup), waiting for the group to exit, removing the
        cgroup and clearing the temp dir finish in the background; without a cgroup they
        are part of the kill (see ``_finish_kill``)."""
        if child.zygote_left is not None:
            await child.zygote_left.wait()  # the call's cgroup.kill must not reach the zygote
        grace = self.config.tools.isolation.kill_grace_seconds
        if grace > 0 and _signal_group(child.pid, signal.SIGTERM):
            with trio.move_on_after(grace):
                while _signal_group(child.pid, 0):
                    await trio.sleep(0.02)
        # cgroup.kill reaches every process of the call, whatever session or environment it has now
        killed_by_cgroup = self.cgroups.kill(child.cgroup)
        killed: set[int] = set()
        if killed_by_cgroup and self._nursery is not None:
            _signal_group(child.pid, signal.SIGKILL)
            self._nursery.start_soon(self._finish_kill, child, killed)
            return
        await self._sweep_until_quiet(child.pid, child.token, killed)
        await self._finish_kill(child, killed)

    async def _finish_kill(self, child: _Child, killed: set[int]) -> None:
        # A process being reparented while its parent exits can be missing from both
        # parents' /proc children lists for an instant: once the whole group is gone (no
        # more reparenting), look once more.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2.0):
                await _wait_exit(child.pid)
                while _signal_group(child.pid, 0):
                    await trio.sleep(0.0005)
            await self._sweep_until_quiet(child.pid, child.token, killed)
            emptied = False  # only an emptied cgroup proves nothing of the call can still write
            if child.cgroup:
                with trio.move_on_after(2.0):
                    while not self.cgroups.remove(child.cgroup):
                        await trio.sleep(0.001)
                    emptied = True
            await self._give_back_temp(child.temp, child.uid, reusable=emptied)

    async def _sweep_until_quiet(self, pid: int, token: str, killed: set[int]) -> None:
        for _ in range(1000):
            if sweeping.sweep_once(self.spawner_pid, pid, token, killed) == 0:
                return
            await trio.sleep(0)

    def close(self) -> None:
        self.workers.close()
        if self._zygotes is not None:
            self._zygotes.close()
        self._control.close()  # the spawner then removes every temp dir it made
        if self._temps is not None:
            self._temps.close()
        self.cgroups.remove_bases()


_TYPES = {t.value for t in ToolErrorType}


def _raise_for(outcome: Outcome) -> None:
    """A failed outcome as the ToolError it reports."""
    if not outcome.ok:
        raise ToolError(
            ToolErrorType(outcome.error_type) if outcome.error_type in _TYPES else ToolErrorType.EXECUTION_FAILED,
            outcome.error_code or "TOOL_FAILED",
            outcome.error_message,
            output=outcome.content or None,
            output_tail=outcome.tail or None,
            unseen_bytes=outcome.unseen_bytes or None,
            unseen_lines=outcome.unseen_lines or None,
            **{k: v for k, v in outcome.error_details.items() if k not in OUTPUT_DETAILS},
        )


_COALESCE_CHARS = 64 * 1024


def _decode_frames(buffer: FrameBuffer, data: bytes) -> list[Chunk | Outcome]:
    """The child's messages in ``data``; a malformed channel is a typed ChildFailed."""
    try:
        return [child_decoder.decode(body) for body in buffer.feed(data)]
    except (ValueError, msgspec.DecodeError) as exc:
        raise ChildFailed(
            ToolErrorType.EXECUTION_FAILED, "CHILD_PROTOCOL", f"Tool failed: malformed message from the child: {exc}"
        ) from None


def _coalesce(chunks: list[Chunk]) -> list[tuple[str, str, int]]:
    """Merge consecutive chunks of the same stream that arrived together (up to 64 KiB),
    so a chatty command costs a few events rather than one per line: (stream, text, merged)."""
    merged: list[tuple[str, str, int]] = []
    for chunk in chunks:
        if merged and merged[-1][0] == chunk.stream and len(merged[-1][1]) + len(chunk.data) <= _COALESCE_CHARS:
            stream_name, text, count = merged[-1]
            merged[-1] = (stream_name, text + chunk.data, count + 1)
        else:
            merged.append((chunk.stream, chunk.data, 1))
    return merged


async def _wait_exit(pid: int) -> None:
    """Until ``pid`` has exited: a pidfd becomes readable then (no polling)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # already gone, or no pidfd support (the caller polls the group anyway)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


_users: dict[int, tuple[str, str]] = {}


def _home_and_user(uid: int) -> tuple[str, str]:
    """From the passwd database, remembered (each lookup reads /etc/passwd); a uid not
    found is looked up again next time."""
    if uid in _users:
        return _users[uid]
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return "/", str(uid)
    _users[uid] = (entry.pw_dir, entry.pw_name)
    return _users[uid]
