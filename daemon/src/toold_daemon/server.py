"""The daemon's root: build the parts, serve until a signal, shut down cleanly.

Order of start: configuration and sandbox (fail fast on bad roots), registry, the
IPC socket (lock, ZAP, bind); ``ready`` is reported only once the socket accepts.
On SIGTERM/SIGINT: stop accepting batches, give running calls the grace period,
cancel what remains (each call still gets its result), flush replies, remove the
socket and exit 0.
"""

from __future__ import annotations

import datetime
import functools
import gc
import grp
import json
import logging
import os
import pwd
import signal
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from toold_protocol import default_runtime_dir as protocol_runtime_dir

from .config import Config, ConfigError, planned_endpoint
from .egress.calls import EgressCall
from .execution.executor import Executor
from .execution.runner import ThreadRunner
from .isolation.peers import parent_of, tool_process
from .isolation.probe import Probe
from .isolation.runner import SpawnRunner
from .mcp import Gateway
from .operation.notify import Notifier
from .operation.privileges import CannotDrop, drop_to
from .records import logs
from .records.audit import AuditTrail, JournalSink, open_sink
from .records.journal import RECOVERY_NAME, Journal
from .records.metrics import write_metrics_forever
from .records.state_files import replace_file
from .records.upkeep import keep_journal_forever
from .records.user_state import UserState
from .sandbox import build_sandbox
from .service import Service
from .service.connections import ConnectionGuard, connection_budget, raise_descriptor_limit
from .service.ipc import Admission, IpcServer, ipc_path
from .service.socket_dir import SocketAccess, check_private_dir
from .tools import Tool
from .tools.builtin import builtin_tools
from .tools.custom import configured_tools
from .tools.registry import Registry
from .undo.ledger import UndoLedger
from .undo.store import UndoStore

log = logging.getLogger("toold")

#: Tracked objects allocated (net) before a young collection: CPython's default is 700.
GC_YOUNG_THRESHOLD = 5_000


class ServeOptions(msgspec.Struct, frozen=True):
    roots: list[Path] = msgspec.field(default_factory=list)
    endpoint: str = ""
    state_dir: Path | None = None
    #: The fork server (pid, control socket), started before trio by ``toold serve``.
    #: Without one, side-effecting tools are refused (IsolationUnavailable).
    spawner: tuple[int, socket.socket] | None = None
    config_path: Path | None = None  # reread on SIGHUP (the policy part)
    plugins: list[Tool[Any]] = msgspec.field(default_factory=list)  # loaded before the spawner forked
    activated_fd: int | None = None  # a listening socket passed by systemd (socket activation)


#: How long a start serves before it makes the tools' planning imports (``warm_planning``):
#: the thread that imports holds the interpreter lock the loop needs, and the first
#: clients' frames come in a start's first milliseconds.
WARM_PLANNING_AFTER_SECONDS = 0.25


async def warm_planning_soon(registry: Registry) -> None:
    await trio.sleep(WARM_PLANNING_AFTER_SECONDS)
    await trio.to_thread.run_sync(warm_planning, registry)


def warm_planning(registry: Registry) -> None:
    """Each tool's planning imports, off the event loop (see ``Tool.warm_planning``)."""
    for tool in registry.list():
        try:
            tool.warm_planning()
        except Exception as exc:  # a plugin's: its first call loads it instead
            log.warning("warming the planning of %s failed: %s: %s", tool.name, type(exc).__name__, exc)


def build_runner(config: Config, options: ServeOptions) -> ThreadRunner | SpawnRunner:
    if options.spawner is None:
        return ThreadRunner()
    return SpawnRunner(*options.spawner, config)


def sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What failed, as it was raised, when one thing did: a start that fails says why by
    the error's type (a configuration, a journal in use, an endpoint), not a group around it."""
    return group.exceptions[0] if len(group.exceptions) == 1 else group


async def learn_layers(runner: SpawnRunner, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The isolation layers, from the probe's child: logged, and the required ones checked.
    Started with ``nursery.start``: its starter goes on once the spawner has the request."""
    layers = await runner.probe(Probe(), task_status=task_status)
    for name, state in sorted(layers.items()):
        (log.info if state.startswith("on") else log.warning)("isolation layer %s: %s", name, state)
    missing = [n for n in runner.config.tools.isolation.require if not layers.get(n, "off").startswith("on")]
    if missing:
        log.error("required isolation layers are off (%s): side-effecting tools will be refused", ", ".join(missing))


def default_runtime_dir() -> Path:
    """Where the default socket lives: the protocol package's rule, shared with every client.

    Not platformdirs' ``user_runtime_dir``: its fallbacks (ownership and mode checks,
    ``/tmp/runtime-UID``) change between versions, and a client that depends on msgspec
    alone could not follow them, so daemon and clients would look in different places.
    """
    return protocol_runtime_dir()


def default_state_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_state_dir("toold"))


def state_dir_of(config: Config, options: ServeOptions) -> Path:
    """The state directory: named (which must exist), or the default (made 0700)."""
    named = options.state_dir or (Path(config.daemon.state_dir) if config.daemon.state_dir else None)
    state_dir = named or default_state_dir()
    if named is None:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return state_dir


def _keep_server_connection(
    audit: AuditTrail, journal: Journal | None, call: EgressCall, record: dict[str, Any]
) -> None:
    """An MCP server's connection (which belongs to no one call): an audit record, and a
    row of the journal's (``toolctl journal connections``)."""
    audit.server_connection(call.server, call.context.identity, record)
    if journal is not None:
        journal.server_connection(call.server, call.context.identity, record)


def open_journal(config: Config, options: ServeOptions) -> Journal | None:
    """Open (or create) the journal and settle what a crash left behind.

    A state directory named on the command line or in the config must already exist: a
    missing one more likely means a wrong path or an unmounted disk than a first start,
    and silently starting an empty journal there would lose the old one.
    """
    if not config.journal.enabled:
        return None
    state_dir = state_dir_of(config, options)
    journal = Journal.open_in(
        state_dir,
        synchronous=config.journal.synchronous,
        server_connections_kept=config.journal.server_connections_kept,
        max_bytes_per_uid=config.journal.max_bytes_per_uid,
    )
    waiting = journal.recover()
    if waiting:
        log.warning("%d interrupted batch(es) wait for resume or discard: %s", len(waiting), ", ".join(waiting[:10]))
    # Retention is applied by the upkeep once serving has begun, a few batches per commit:
    # batches that expired while the daemon was stopped can take seconds to delete.
    _note_recovery(state_dir, journal.interrupted_calls, len(waiting))
    return journal


def _note_recovery(state_dir: Path, interrupted: int, waiting: int) -> None:
    """What this start's recovery found, for ``toold doctor`` (counts only, no ids)."""
    note = {
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "interrupted_calls": interrupted,
        "waiting_batches": waiting,
    }
    try:
        replace_file(state_dir / RECOVERY_NAME, (json.dumps(note) + "\n").encode())
    except OSError as exc:
        log.warning("cannot note the recovery in %s: %s", state_dir, exc.strerror)


def prepare_runtime_dir(directory: Path, heir: int | None = None, *, shared: bool = False) -> None:
    """Create the socket's directory 0700; refuse one that is a symlink, not ours (or
    ``heir``'s), or not 0700 (0710 when ``shared`` with the socket's group)."""
    directory.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    check_private_dir(directory, exact_mode=0o710 if shared and mode == 0o710 else 0o700, heir=heir)


def socket_access(config: Config) -> SocketAccess:
    """``[daemon] socket_group`` and ``socket_mode``; a group that does not exist stops the start."""
    group = config.daemon.socket_group
    if not group:
        return SocketAccess(None, config.daemon.socket_mode)
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"[daemon] socket_group: no group {group!r} on this system") from None
    return SocketAccess(gid, config.daemon.socket_mode)


def service_user_uid(config: Config) -> int | None:
    """The uid a root start will drop to (``[daemon] user``), if any: what it leaves in the
    runtime directory is accepted at the next start."""
    if os.geteuid() != 0 or not config.daemon.user:
        return None
    try:
        return pwd.getpwnam(config.daemon.user).pw_uid
    except KeyError:
        return None  # the drop says why


def _drop_privileges(
    config: Config,
    runner: ThreadRunner | SpawnRunner,
    journal: Journal | None,
    ipc: IpcServer,
    user_state: UserState,
    *,
    undo: UndoLedger | None,
) -> None:
    """Become ``[daemon] user`` now that the spawner runs, the socket is bound and the
    journal is open (see ``privileges``); a drop that cannot be made stops the daemon."""
    if not isinstance(runner, SpawnRunner):
        raise CannotDrop("[daemon] user needs the isolated spawner (tools must run as their clients)")
    own: list[Path] = []
    if journal is not None:
        state = journal.path.parent
        companions = [journal.path.with_name(journal.path.name + suffix) for suffix in ("-wal", "-shm")]
        own += [state, journal.path, state / "journal.lock", *companions]
    own += [user_state.path.parent, *user_state.companions()]
    if undo is not None:
        own += [undo.store.directory, *undo.store.directory.iterdir()]
    socket_path = ipc_path(ipc.endpoint) if ipc.activated_fd is None else None  # systemd's socket stays systemd's
    if socket_path is not None:
        own += [socket_path.parent, socket_path, socket_path.with_name(socket_path.name + ".lock")]
    if config.daemon.metrics_file:  # replaced through a temporary file beside it
        own.append(Path(config.daemon.metrics_file).parent)
    runner.temps_from_spawner()
    others = os.geteuid() == 0 or parent_of(runner.spawner_pid) != os.getpid()  # a root spawner of its own
    report = drop_to(config.daemon.user, own=own, cgroups=runner.cgroups, others=others)
    for name, state_ in sorted(report.items()):
        log.info("protocol process %s: %s", name, state_)


def resolve_endpoint(config: Config, options: ServeOptions) -> str:
    """``planned_endpoint``, with the default socket's directory made ready when it is
    the one used."""
    if not (options.endpoint or config.daemon.endpoint):
        prepare_runtime_dir(
            default_runtime_dir(), heir=service_user_uid(config), shared=bool(config.daemon.socket_group)
        )
    return planned_endpoint(config, options.endpoint)


async def serve(config: Config, options: ServeOptions, *, ready: Callable[[str], None] | None = None) -> None:
    runner = build_runner(config, options)
    try:
        async with trio.open_nursery() as starting:
            # The spawner forks the probe's child and the child confines itself (in other
            # processes, often on the other core) while this one builds everything else.
            if isinstance(runner, SpawnRunner):
                await starting.start(learn_layers, runner)
            sandbox = build_sandbox(config, options.roots)
            registry = Registry()
            for tool in builtin_tools():
                reason = tool.unavailable(config)
                if reason:
                    registry.withhold(tool.name, reason)
                else:
                    registry.register(tool)
            for tool in configured_tools(config.tools):  # names checked against the built-ins when the config loaded
                registry.register(tool)
            for tool in options.plugins:  # names checked by the loader
                registry.register(tool)
            notifier = Notifier.from_environment()
            notifier.status("recovering the journal")
            journal = open_journal(config, options)
            endpoint = resolve_endpoint(config, options)

            user_state = UserState.open_in(state_dir_of(config, options))
            if isinstance(runner, SpawnRunner):
                runner.user_state = user_state
            undo = _undo_ledger(config, options, journal)
            executor = Executor(runner, sandbox, config, journal, undo)
            gateway = _gateway(config, runner, registry)
            ipc = IpcServer(
                endpoint,
                guard=_connection_guard(config),
                hard_max_frame_bytes=config.daemon.max_frame_bytes * 4,
                max_backlog_bytes=config.daemon.max_peer_backlog_bytes,
                max_uid_backlog_bytes=config.daemon.max_uid_backlog_bytes,
                refuse=_refuse_tool_processes(runner),
                activated_fd=options.activated_fd,
                heir=service_user_uid(config),
                socket_access=socket_access(config),
            )
            sink = open_sink(
                config.daemon.audit, config.daemon.audit_journal_socket, stderr_is_journal=logs.stderr_is_journal()
            )
            audit = AuditTrail(sink)
            if isinstance(runner, SpawnRunner):  # an MCP server's connections belong to no call: kept as they come
                runner.egress.on_server_record = functools.partial(_keep_server_connection, audit, journal)
            service = Service(
                config=config,
                registry=registry,
                sandbox=sandbox,
                executor=executor,
                send=ipc.send,
                forget=ipc.forget,
                isolation=runner.isolation if isinstance(runner, SpawnRunner) else list(ThreadRunner.ISOLATION),
                journal=journal,
                config_path=options.config_path,
                gateway=gateway,
                audit=audit,
                audit_dropped=lambda: sink.dropped if isinstance(sink, JournalSink) else 0,
                waiting_for_clients=ipc.waiting_bytes_by_uid,
                doorbell=ipc,
            )
            settle_garbage_collector()  # within the probe's time too
    except BaseExceptionGroup as group:  # (the nursery's way of raising what failed in it)
        raise sole_error(group) from None
    if isinstance(runner, SpawnRunner):
        service.isolation = runner.isolation
    try:
        ipc.claim()
        if config.daemon.user:
            _drop_privileges(config, runner, journal, ipc, user_state, undo=undo)
        # Bound only now: libzmq starts its threads with the first socket, and no_new_privs, the
        # bounding set and Landlock are each thread's own, so threads born before the drop
        # would keep root's (a libzmq bug could then exec its way back to privileges).
        ipc.bind()
        if isinstance(runner, SpawnRunner):
            runner.service_gids = service_groups(config, ipc)
        if journal is not None:
            journal.start_writer()  # after the drop: a thread keeps the credentials it starts with
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                service.bind_nursery(nursery)
                if isinstance(runner, SpawnRunner):
                    runner.bind_nursery(nursery)
                    nursery.start_soon(runner.workers.retire_idle_forever)
                if gateway is not None:
                    gateway.bind_nursery(nursery)
                    nursery.start_soon(gateway.retire_idle_forever)
                if isinstance(sink, JournalSink):
                    sink.bind_nursery(nursery)
                audit.bind_nursery(nursery)
                if journal is not None:
                    journal.bind_nursery(nursery, _crowded(runner))
                    nursery.start_soon(keep_journal_forever, journal, undo, config.journal.retention_days)
                metrics_file = config.daemon.metrics_file
                if metrics_file:
                    every = config.daemon.metrics_interval_seconds
                    nursery.start_soon(write_metrics_forever, service.shared.metrics, Path(metrics_file), every)
                await service.finish_interrupted_undos()
                await nursery.start(ipc.serve, service.handle)
                log.info("serving %s; roots: %s", endpoint, ", ".join(map(str, sandbox.roots)))
                if ready is not None:
                    ready(endpoint)
                notifier.ready(_status(service))  # the socket serves and recovery is done
                nursery.start_soon(notifier.keep_alive, lambda: _status(service))
                nursery.start_soon(warm_planning_soon, registry)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        notifier.reloading()
                        service.reload_policy()  # logs the outcome; a bad policy keeps the old
                        notifier.ready(_status(service))
                        continue
                    log.info("received %s; shutting down", signal.Signals(signum).name)
                    notifier.stopping()
                    break
                await service.shutdown(config.daemon.shutdown_grace_seconds)
                if gateway is not None:
                    await gateway.close()
                await _drain_replies(ipc)
                nursery.cancel_scope.cancel()
    finally:
        ipc.close()
        if isinstance(runner, SpawnRunner):
            runner.close()
        if journal is not None:
            journal.close()
        user_state.close()
        notifier.close()
        audit.write_queued()  # what batches ended with after the audit's task stopped
        if isinstance(sink, JournalSink):
            sink.close()


def _undo_ledger(config: Config, options: ServeOptions, journal: Journal | None) -> UndoLedger | None:
    """Pre-images for ``toolctl undo``, beside the journal (none without one); those of
    batches the journal no longer holds are removed by the upkeep, once serving."""
    if journal is None:
        return None
    store = UndoStore.open_in(state_dir_of(config, options))
    return UndoLedger(store, journal, config.journal.undo_max_bytes_per_batch)


def _gateway(config: Config, runner: ThreadRunner | SpawnRunner, registry: Registry) -> Gateway | None:
    """The MCP gateway when servers are configured: it needs the spawner, which starts
    each server as its user under the same confinement as a command."""
    if not config.mcp.servers:
        return None
    if not isinstance(runner, SpawnRunner):
        log.error("[[mcp.servers]] need the isolated spawner; their tools are not offered")
        return None
    gateway = Gateway(config.mcp, runner, registry)
    runner.gateway = gateway
    return gateway


def settle_garbage_collector() -> None:
    """Tune the collector for a long request loop, and turn it on (``toold`` starts with it
    off: see ``program``). What start-up built (modules, the registry, compiled patterns,
    configuration) lives as long as the daemon: frozen, it is never traversed again.
    Requests leave few survivors, so the youngest generation may grow further before a
    collection. Measured over 3,100 reads of 4 KB after start-up: collections 44 -> 4,
    worst pause 28 ms -> 1.0 ms, time in the collector 50 -> 3.3 ms.

    No full collection first: it took 12-16 ms of every start to free the few cycles the
    imports left (about 2,700 objects)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)
    gc.enable()


def _crowded(runner: ThreadRunner | SpawnRunner) -> Callable[[], bool]:
    """Whether the loop serves several calls at once (``Journal.bind_nursery``)."""
    if isinstance(runner, SpawnRunner):
        return runner.workers.crowded
    return lambda: False


def _status(service: Service) -> str:
    """The one line systemd shows for the service (``systemctl status``)."""
    running = sum(session.running for session in service.sessions)
    return f"serving {len(service.sessions)} sessions, {running} running batches"


def service_groups(config: Config, ipc: IpcServer) -> frozenset[int]:
    """The groups that are the service's own: the socket's group and the service user's
    primary group (never root's). Tool processes do not keep them."""
    gids: set[int] = set()
    if config.daemon.user:
        try:
            gids.add(pwd.getpwnam(config.daemon.user).pw_gid)
        except KeyError:
            pass
    try:
        path = ipc_path(ipc.endpoint)
        if ipc.activated_fd is not None:
            gids.add(os.fstat(ipc.activated_fd).st_gid)
        elif path is not None:
            gids.add(os.stat(path).st_gid)
    except OSError:
        pass
    return frozenset(gids - {0})


def _connection_guard(config: Config) -> ConnectionGuard:
    limit = raise_descriptor_limit()
    total = connection_budget(limit, config.daemon.max_connections)
    per_uid = min(config.daemon.max_connections_per_uid, total)
    log.info("connections: at most %d in all, %d per uid (descriptor limit %d)", total, per_uid, limit)
    return ConnectionGuard(per_uid=per_uid, total=total)


def _refuse_tool_processes(runner: object) -> Admission | None:
    """A tool never reaches the daemon: processes below the spawner (or in a call cgroup)
    are turned away at the door, before they can submit or approve anything."""
    if not isinstance(runner, SpawnRunner):
        return None
    spawner_pid = runner.spawner_pid
    marker = f"/toold-{os.getpid()}/"
    return lambda identity: tool_process(identity.pid, spawner_pid, marker)


async def _drain_replies(ipc: IpcServer, seconds: float = 1.0) -> None:
    """Give the pump a moment to hand queued replies to libzmq before closing."""
    with trio.move_on_after(seconds):
        while ipc.pending():
            await trio.sleep(0.005)
