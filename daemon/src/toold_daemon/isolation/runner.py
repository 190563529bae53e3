"""``SpawnRunner``: the trio side of isolated execution (the executor's ToolRunner).

Per call: make a private temp dir, build the request (sanitized environment, limits,
identity, roots), hand the spawner the write end of a fresh channel pipe, then read
frames from the read end until the child's ``Outcome`` or end of file. Whatever ends
the call (outcome, timeout, cancel, crash), the whole process group and every escaped
descendant are killed before the runner returns, and the temp dir is removed.

Python tools (reads included, whoever the client is) run in tool workers (``workers``):
confined like a command, kept warm, one frame each way per call. Commands run through a
zygote (``zygotes``) or a fresh child.

Beside it: ``spawn_requests`` builds what the spawner is asked for, ``spawner_link``
carries each request and its reply, ``child_output`` reads what a child sends back,
``call_end`` kills whatever a call started and gives its temp dir back.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from toold_protocol import Identity, IsolationLayer, ToolErrorType

from ..config import Config
from ..egress.calls import EgressCall, EgressCalls
from ..egress.rules import EgressRules
from ..errors import ToolError
from ..sandbox import Sandbox
from ..tools._base import Command, Tool, ToolContext, ToolOutput
from . import sweep as sweeping
from .admission import peer_credentials
from .call_end import CallKiller, CallProcess, signal_group
from .cgroup import Cgroups, CgroupUnavailable
from .child_output import ChildFailed, collect, decode_frames, output_of, raise_for
from .jobs import Job, Jobs
from .spawn_requests import SpawnRequests
from .spawner_link import SpawnerLink
from .tempdirs import TempDirs
from .wire import (
    Chunk,
    FrameBuffer,
    Outcome,
    SpawnRequest,
    TempDone,
    TempWanted,
    outcome_limit,
)
from .worker import STALE
from .workers import WorkerFailed, Workers, WorkerUnavailable
from .zygotes import CommandNotStarted, Leaving, Zygotes, ZygoteUnavailable

log = logging.getLogger(__name__)
BACKGROUND_TIMEOUT_S = 3600.0  # a background job without timeout_ms is killed after an hour
STALE_CGROUP_TRIES = 60


class StdioChild(msgspec.Struct, frozen=True):
    """A long-lived confined program: its stdio socket and the read end of its stderr."""

    child: CallProcess
    channel: socket.socket
    stderr: int

    @property
    def pid(self) -> int:
        return self.child.pid


class SpawnRunner:
    def __init__(self, spawner_pid: int, control: socket.socket, config: Config) -> None:
        self.spawner_pid = spawner_pid
        self._link = SpawnerLink(spawner_pid, control)
        self._euid = peer_credentials(control)[1]  # the spawner's: it acts for anyone when root
        self.config = config
        self._requests = SpawnRequests(config)
        self._config_bytes = self._requests.config_bytes
        isolation = config.tools.isolation
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
        self.gateway: Any = None  # third-party MCP servers (``mcp.Gateway``), set by the server
        self.cgroups = Cgroups.detect(config.tools.isolation.cgroups)
        # None: the spawner's (see temps_from_spawner); a spawner of its own always makes them.
        self._temps: TempDirs | None = TempDirs(self._euid) if self._euid == os.geteuid() else None
        self._zygotes = (
            Zygotes(self._link.ask, self.cgroups, isolation.processes, isolation.address_space_mb * 1024 * 1024)
            if isolation.zygotes
            else None
        )
        self.workers = Workers(
            self._link.ask,
            self.cgroups,
            pids_max=isolation.processes,
            memory_max=isolation.address_space_mb * 1024 * 1024,
            max_workers=isolation.max_workers,
            max_per_uid=isolation.max_workers_per_uid,
            idle_seconds=isolation.worker_idle_seconds,
            outcome_limit=outcome_limit(config.journal.undo_max_bytes_per_batch),
        )
        self._nursery: trio.Nursery | None = None
        self._killer = CallKiller(self.cgroups, spawner_pid, isolation.kill_grace_seconds, self._give_back_temp)

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        """Where background jobs are followed; cancelling it (shutdown) kills them all."""
        self._nursery = nursery
        self._killer.nursery = nursery
        self.workers.nursery = nursery
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
    def service_gids(self) -> frozenset[int]:
        """The service's own groups (the socket's, the service user's): never a tool's."""
        return self._requests.service_gids

    @service_gids.setter
    def service_gids(self, gids: frozenset[int]) -> None:
        self._requests.service_gids = gids

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

    async def probe(
        self, tool: Tool[Any], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> dict[str, str]:
        """Run ``tool`` (a no-op) in a child with the network cut, to learn which layers the
        kernel grants; the answer goes into ``welcome`` and ``toold doctor``. The child is
        killed whatever happens, a cancellation included. Started with ``nursery.start``,
        it lets its starter go on as soon as the spawner has the request: the daemon's
        start builds everything else while the spawner forks the child and the child
        confines itself, on the other core."""
        ctx = ToolContext(call_id="probe", sandbox=None, config=self.config)  # type: ignore[arg-type]
        me = Identity(uid=self._euid, gid=os.getegid(), pid=os.getpid())
        outcome = await self._spawn(tool, tool.args_type(), ctx, me, probe=True, sent=task_status.started)
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
        return output_of(outcome)

    def begin(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> None:
        """Send a worker call's request now if a worker of its kind is idle (``Workers.begin``):
        ``run`` with the same ``ctx`` then only waits for the outcome. Anything else
        (a command, a gateway tool, no idle worker) simply starts in ``run``."""
        if (
            self._euid not in (identity.uid, 0)
            or (self.gateway is not None and self.gateway.serves(tool))
            or tool.runs_in_daemon(self.config)
            or tool.network
        ):
            return
        try:
            if tool.command(args, ctx) is not None:
                return
        except ToolError:
            return  # ``run`` builds it again and reports why
        request = self._requests.tool_request(tool, args, ctx, identity, preview=False)
        ctx.begun = self.workers.begin(request, self._config_bytes)

    def finished(self, ctx: ToolContext, interrupt_fd: int | None) -> ToolOutput | None:
        """The output of ``ctx``'s begun call if its worker has answered already, or
        answers within a short wait that ``interrupt_fd`` ends (``Workers.outcome_now``);
        a failed one raises its ``ToolError``. None: ``run`` finishes the call."""
        begun = ctx.begun
        if begun is None:
            return None
        outcome = self.workers.outcome_now(begun, interrupt_fd)
        if outcome is None:
            return None
        ctx.begun = None
        if outcome.error_code == STALE:
            return None  # ``run`` runs it anew in a fresh worker
        return output_of(outcome)

    def abandon(self, ctx: ToolContext) -> None:
        """``ctx``'s call was begun and will not be run (``Workers.abandon``)."""
        if ctx.begun is not None:
            begun, ctx.begun = ctx.begun, None
            self.workers.abandon(begun)

    def jobs_running(self) -> bool:
        return self.jobs.any_running()

    def spin_only_when(self, serves_one_call: Callable[[], bool]) -> None:
        self.workers.loop_serves_one_call = serves_one_call

    async def preview(self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity) -> str | None:
        """The call's diff preview, computed in a worker with the client's privileges; a
        call that would fail raises its error (the request then shows why)."""
        outcome = await self._in_worker(tool, args, ctx, identity, preview=True)
        raise_for(outcome)
        return outcome.content or None

    async def _in_worker(
        self, tool: Tool[Any], args: Any, ctx: ToolContext, identity: Identity, *, preview: bool = False
    ) -> Outcome:
        """One Python tool call in a worker of the client's kind. A call that is cancelled
        or times out ends its worker; the partial output says so."""
        self._check_identity(identity)
        begun, ctx.begun = ctx.begun, None
        if begun is not None:
            request = begun.request
        else:
            request = self._requests.tool_request(tool, args, ctx, identity, preview=preview)

        def on_chunk(chunk: Chunk) -> None:
            ctx.partial.append(chunk.data)
            if ctx.emit is not None:
                ctx.emit(chunk.stream, chunk.data, 1)

        try:
            return await self.workers.run(request, self._config_bytes, on_chunk, begun=begun)
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
        request = self._requests.tool_request(None, None, ctx, identity, preview=False)
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
            await self._killer.kill(child)
            raise ToolError(ToolErrorType.SANDBOX_VIOLATION, "LIMITS_EXCEEDED", str(exc)) from None

        def kill() -> None:  # from shell_jobs' worker thread; the follower then sweeps
            job.state = "killed"  # before the signal: the outcome that follows must not say "exited"
            # the cgroup first: an unprivileged daemon cannot signal another user's group
            if not self.cgroups.kill(child.cgroup):
                signal_group(child.pid, signal.SIGKILL)

        job.kill = kill
        limit = tool.timeout_seconds(args) or BACKGROUND_TIMEOUT_S
        self._nursery.start_soon(self._follow, job, child, limit)
        return ToolOutput(
            f"started {job.job_id} (pid {child.pid}) in the background; read or kill it with shell_jobs",
            data={"job_id": job.job_id, "pid": child.pid},
        )

    async def _follow(self, job: Job, child: CallProcess, limit: float) -> None:
        """Read a background job's frames into its bounded buffer until it ends, its time
        limit passes, or the daemon stops; then kill what is left and clean up."""
        keep = self.config.tools.output.max_bytes
        buffer = FrameBuffer()
        exited = False
        try:
            with trio.move_on_after(limit):
                async with trio.lowlevel.FdStream(child.read_end) as stream:
                    while data := await stream.receive_some(65536):
                        for message in decode_frames(buffer, data):
                            if isinstance(message, Chunk):
                                job.add_output(message.data, keep)
                            elif isinstance(message, Outcome):
                                exit_code = (message.data or {}).get("exit_code")
                                job.exit_code = exit_code if isinstance(exit_code, int) else None
                                exited = True
        except ChildFailed as exc:  # garbage on the channel: end the job, never the daemon
            job.add_output(f"\n[toold: {exc.message}]\n", keep)
        finally:
            with trio.CancelScope(shield=True):
                # its proxy listener goes with it; its connections are kept with the job,
                # which reads as ended only once they are (so its output has them all)
                job.network = await self.egress.forget(child.token)
                await self._killer.kill(child)
            if job.state == "running":
                job.state = "exited" if exited else "killed"

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
        sent: Callable[[], object] | None = None,
    ) -> Outcome:
        """Run one call in a child and return its outcome; the child and everything it
        started are killed, and its temp dir cleared, whatever ends the wait. ``sent`` is
        called once the spawner has the request."""
        child = await self._launch(tool, args, ctx, identity, command=command, probe=probe, preview=preview, sent=sent)
        return await self._finish(child, ctx)

    async def _finish(self, child: CallProcess, ctx: ToolContext) -> Outcome:
        """Wait for a launched child's outcome; then kill it and everything it started."""
        try:
            outcome = await collect(child.read_end, ctx, self.config.tools.output.max_bytes)
            network = await self.egress.forget(child.token, connected=not outcome.unconnected)
            if network:
                outcome = msgspec.structs.replace(outcome, data={**(outcome.data or {}), **network})
            return outcome
        finally:
            with trio.CancelScope(shield=True):
                # ended early (timed out, cancelled): its connections go in the error result
                ctx.network = await self.egress.forget(child.token) or ctx.network
                await self._killer.kill(child)

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
        sent: Callable[[], object] | None = None,
    ) -> CallProcess:
        """Start a child for one call: its token, temp dir, cgroup and channel. On failure
        nothing is left behind; on success the caller owns killing and cleaning up."""
        self._check_identity(identity)
        token = secrets.token_hex(12)
        temp = "" if probe else await self._take_temp(identity)  # the probe writes nothing
        via_zygote = self._zygotes is not None and command is not None and bool(command.argv)
        read_end, write_end = os.pipe()
        try:
            request = self._requests.command_request(
                tool.name, args, ctx, identity=identity, token=token, temp=temp, command=command, probe=probe
            )
            if preview:
                request = msgspec.structs.replace(request, preview=True)
            if command is not None and command.network:
                request = self._requests.network_mode(tool.name, request)
            left = None
            if self._zygotes is not None and via_zygote:
                pid, group, left = await self._start_command(self._zygotes, request, write_end, ctx)
            else:
                pid, group = await self._fork_with_egress(request, [write_end], ctx, probe=probe, sent=sent)
        except BaseException:
            os.close(read_end)
            with trio.CancelScope(shield=True):
                await self._give_back_temp(temp, identity.uid, reusable=False)
            raise
        finally:
            os.close(write_end)
        # A zygote is moved into its cgroup by the daemon before it starts the command there,
        # and under Landlock nothing the command starts can write a cgroup.procs to leave it.
        contained = via_zygote and bool(group) and self.layers.get("landlock", "").startswith("on")
        return CallProcess(pid, read_end, token, temp, identity.uid, group, zygote=left, contained=contained)

    async def _decide_egress(self, call: EgressCall, host: str, port: int) -> tuple[bool, str]:
        """The rules first; a host they neither allow nor deny is the person's to answer."""
        judgement, why, normal = self._egress_rules.judge(host, port)
        if judgement != "ask":
            return judgement == "allow", why
        ask = getattr(call.context, "ask_network", None)
        if ask is None:
            return False, f"{normal} is not in [tools.network] allowed_domains, and nobody can be asked"
        allowed, answer = await call.ask_person(normal, port, ask)
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
        ctx = ToolContext(call_id=f"server-{token}", sandbox=sandbox, config=self.config, identity=identity)
        request = self._requests.command_request(
            name, None, ctx, identity=identity, token=token, temp=temp, command=command, probe=False
        )
        request = msgspec.structs.replace(request, stdio=True, readable=readable, hidden_patterns=[])
        if command.network:
            request = self._requests.network_mode(name, request)
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
        return StdioChild(CallProcess(pid, -1, token, temp, identity.uid, group), ours, err_read)

    async def stop_stdio(self, started: StdioChild) -> None:
        """Kill a program ``start_stdio`` started, everything it started, and clean up."""
        started.channel.close()
        with trio.CancelScope(shield=True):
            await self.egress.forget(started.child.token)
            await self._killer.kill(started.child)

    async def _fork_with_egress(
        self,
        request: SpawnRequest,
        fds: list[int],
        ctx: ToolContext,
        *,
        probe: bool = False,
        sent: Callable[[], object] | None = None,
    ) -> tuple[int, str]:
        """A fresh child (not a zygote); in proxy mode with one more fd, the link its
        egress process talks to the daemon on, served and registered for the call."""
        if not request.egress_proxy or self._nursery is None:
            return await self._fork_child(
                msgspec.structs.replace(request, egress_proxy=False), fds, probe=probe, sent=sent
            )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            started = await self._fork_child(request, [*fds, theirs.fileno()], probe=probe, sent=sent)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        link = trio.socket.from_stdlib_socket(ours)
        self._nursery.start_soon(self.egress.serve, link)
        self.egress.register(request.token, link, ctx, server=request.tool if request.stdio else "")
        return started

    async def _fork_child(
        self,
        request: SpawnRequest,
        write_end: int | list[int],
        *,
        probe: bool = False,
        sent: Callable[[], object] | None = None,
    ) -> tuple[int, str]:
        """A fresh child from the spawner, which joins a new call cgroup first thing:
        (pid, the cgroup's name or "" without cgroups). A call whose cgroup cannot be
        made is refused, not run without it; only the start's ``probe``, which reports the
        cgroup layer as its child finds it, goes on without (known by how it was started,
        never by anything a client can name, such as a call id)."""
        isolation = self.config.tools.isolation
        try:
            group = self.cgroups.create(
                f"call-{request.token}",
                pids_max=isolation.processes,
                memory_max=isolation.address_space_mb * 1024 * 1024,
            )
        except CgroupUnavailable as exc:
            if not probe:
                raise ToolError(ToolErrorType.ISOLATION_UNAVAILABLE, "ISOLATION_UNAVAILABLE", str(exc)) from None
            log.warning("the probe starts without a cgroup: %s", exc)
            group = ""
        try:
            pid = await self._link.ask(
                msgspec.structs.replace(request, cgroups=self.cgroups.paths(group)), write_end, sent=sent
            )
        except BaseException:
            self.cgroups.remove(group)
            raise
        return pid, group

    async def _start_command(
        self, zygotes: Zygotes, request: SpawnRequest, write_end: int, ctx: ToolContext
    ) -> tuple[int, str, Leaving | None]:
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
        reply = await self._link.chore(TempWanted(uid=identity.uid, gid=identity.gid))
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
            await self._link.chore(TempDone(path=temp, reusable=reusable))

    def close(self) -> None:
        self.workers.close()
        if self._zygotes is not None:
            self._zygotes.close()
        self._link.close()
        if self._temps is not None:
            self._temps.close()
        self.cgroups.remove_bases()
