"""``toold``: the daemon's command line: ``serve``, ``spawner``, ``check-config``, ``doctor``.

Imports are ordered on purpose: the fork server is started after only the tool modules
are loaded, before trio, pyzmq and sqlite3, so it stays small and each fork stays cheap.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import SYSTEM_CONFIG, SYSTEM_SPAWNER_SOCKET, Config, ConfigError, endpoint_refusal, planned_endpoint
from .config.loading import load_file
from .isolation.admission import Admission
from .isolation.probe import Probe
from .isolation.spawner import start as start_spawner
from .isolation.spawner_socket import SpawnerUnreachable
from .isolation.spawner_socket import connect as connect_spawner
from .isolation.spawner_socket import listen as listen_for_daemons
from .operation.activation import ActivationError, take_activated_socket
from .operation.hardening import harden_process
from .records import logs
from .tools import Tool, web_search
from .tools.builtin import builtin_tools
from .tools.custom import taken_names
from .tools.plugin_loader import PluginReport, load_plugins

if TYPE_CHECKING:
    from .operation.checks import Check

LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _log_level(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level``, in any case (``debug`` as ``DEBUG``)."""
    parser.add_argument("--log-level", default=default, type=str.upper, choices=LOG_LEVELS, help="debug ... error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toold", description="Tool-execution daemon for LLM agents")
    parser.add_argument("--version", action="version", version=f"toold {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    completion = sub.add_parser("completion", help="print a shell completion script (bash, zsh or fish)")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    serve_cmd = sub.add_parser("serve", help="run the daemon in the foreground")
    serve_cmd.add_argument(
        "--root",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="sandbox root (repeatable; default: the current directory)",
    )
    serve_cmd.add_argument("--endpoint", default="", help="ZeroMQ endpoint, e.g. ipc:///run/toold.sock")
    serve_cmd.add_argument("--state-dir", type=Path, default=None, help="where the daemon keeps its state")
    serve_cmd.add_argument("--config", type=Path, default=None, help="TOML configuration file")
    _log_level(serve_cmd, "INFO")
    serve_cmd.add_argument(
        "--spawner-socket",
        default="",
        metavar="PATH",
        help="use the spawner listening here (toold spawner) instead of forking one ([daemon] spawner_socket)",
    )
    spawner_cmd = sub.add_parser(
        "spawner", help="run the privileged spawner on its own, for a protocol process run as [daemon] user"
    )
    spawner_cmd.add_argument("--spawner-socket", default="", metavar="PATH", help="where to listen")
    spawner_cmd.add_argument("--config", type=Path, default=None, help="TOML configuration file")
    spawner_cmd.add_argument("--root", action="append", default=[], type=Path, metavar="DIR", help="as for serve")
    spawner_cmd.add_argument("--endpoint", default="", help="the clients' socket, whose mode says who may connect")
    _log_level(spawner_cmd, "INFO")
    check = sub.add_parser("check-config", help="validate a configuration file (and its policy) without starting")
    check.add_argument("file", type=Path)
    _log_level(check, "WARNING")
    doctor_cmd = sub.add_parser("doctor", help="show which isolation layers this machine grants, and why not")
    doctor_cmd.add_argument(
        "--config", type=Path, default=None, help=f"TOML configuration file (default: {SYSTEM_CONFIG} if it exists)"
    )
    _log_level(doctor_cmd, "WARNING")
    doctor_cmd.add_argument("--endpoint", default="", help="the socket to report on (default: as serve would)")
    doctor_cmd.add_argument("--state-dir", type=Path, default=None, help="the state directory to report on")
    doctor_cmd.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    doctor_cmd.add_argument(
        "--spawner-socket",
        default="",
        metavar="PATH",
        help=f"the spawner to report on (default: [daemon] spawner_socket, or {SYSTEM_SPAWNER_SOCKET} if present)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if args.command != "serve":
        gc.enable()  # off while the modules loaded (see program); serve turns it on later
    if args.command == "completion":
        print(_completion_script(["toold"], shell=args.shell))
        return 0
    logs.configure(args.log_level)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "doctor" and args.config is None and SYSTEM_CONFIG.is_file():
        args.config = SYSTEM_CONFIG  # the installed service's: doctor reports on what runs
    try:
        config = load_file(args.config) if args.config else Config()
    except ConfigError as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    web_search.capture_key(config)  # the administrator's search key, before it is scrubbed
    scrubbed = harden_process()  # before the fork: the spawner and its children inherit it
    if scrubbed:
        logging.getLogger("toold").info("removed secret-looking variables from the environment: %s", scrubbed)
    try:
        activated = take_activated_socket() if args.command == "serve" else None
    except ActivationError as exc:
        print(f"toold: socket activation: {exc}", file=sys.stderr)
        return 2
    if activated is not None:
        args.endpoint = activated.endpoint  # the socket's own path: the spawner admits by its mode
    plugins, reports = load_plugins(config.daemon, taken=taken_names(config.tools))
    tools = [*builtin_tools(), *plugins, Probe()]
    spawner_socket = getattr(args, "spawner_socket", "") or config.daemon.spawner_socket
    if args.command == "spawner":
        return run_spawner(spawner_socket, config, tools, admission_for(args, config))
    if args.command == "serve" and spawner_socket:
        try:
            spawner = connect_spawner(spawner_socket)
        except SpawnerUnreachable as exc:
            print(f"toold: {exc}", file=sys.stderr)
            return 2
        return run_serve(args, config, spawner, plugins, activated.fd if activated else None)
    # The fork server starts now, while this process is single-threaded and trio not running.
    gc.freeze()  # what start-up built: shared with the spawner, walked by neither's collector
    spawner = start_spawner(tools, admission_for(args, config))
    if args.command == "doctor":
        return doctor(config, spawner, reports, args)
    return run_serve(args, config, spawner, plugins, activated.fd if activated else None)


def run_spawner(path: str, config: Config, tools: list[Tool[Any]], admission: Admission) -> int:
    """``toold spawner``: listen on ``path`` and serve protocol processes of ``[daemon]
    user`` (or of our own uid, without one) until stopped."""
    import pwd

    from .isolation.spawner import serve_forever
    from .operation.notify import Notifier

    if not path.startswith("/"):
        print("toold: spawner: --spawner-socket or [daemon] spawner_socket must be absolute", file=sys.stderr)
        return 2
    try:
        entry = pwd.getpwnam(config.daemon.user) if config.daemon.user else pwd.getpwuid(os.geteuid())
    except KeyError:
        print(f"toold: spawner: [daemon] user {config.daemon.user!r} does not exist", file=sys.stderr)
        return 2
    try:
        listener = listen_for_daemons(path, entry.pw_uid, entry.pw_gid)
    except OSError as exc:
        print(f"toold: spawner: cannot listen on {path}: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("toold").info("spawner listening on %s for uid %d", path, entry.pw_uid)
    notifier = Notifier.from_environment()
    notifier.ready("waiting for the protocol process")
    notifier.close()  # a single-threaded spawner has no loop to ping a watchdog from
    try:
        serve_forever(listener, tools, admission, entry.pw_uid)
    except KeyboardInterrupt:
        pass
    return 0


def admission_for(args: argparse.Namespace, config: Config) -> Admission:
    """The spawner's own rules, from the administrator's config and command line."""
    from .sandbox import build_sandbox

    try:
        roots = tuple(str(r) for r in build_sandbox(config, getattr(args, "root", None) or []).roots)
    except (OSError, ValueError):
        roots = ()  # serving fails on these roots anyway, and says why
    endpoint = planned_endpoint(config, getattr(args, "endpoint", None) or "")
    daemon = config.daemon
    return Admission(
        daemon_roots=roots,
        allowed_roots=tuple(config.tools.sandbox.allowed_roots),
        allowed_uids=tuple(daemon.allowed_uids) if daemon.allowed_uids is not None else None,
        allowed_gids=tuple(daemon.allowed_gids),
        allow_root_clients=daemon.root_clients_allowed(),
        socket_path=endpoint.removeprefix("ipc://") if endpoint.startswith("ipc://") else "",
        readable_paths=tuple(os.path.realpath(p) for server in config.mcp.servers for p in server.read_paths),
    )


def run_serve(
    args: argparse.Namespace,
    config: Config,
    spawner: tuple[int, socket.socket],
    plugins: list[Tool[Any]],
    activated_fd: int | None,
) -> int:
    import trio

    from .operation.privileges import CannotDrop
    from .records.journal import JournalError
    from .records.state_files import StateFileRefused
    from .sandbox.paths import UNCHECKED_FOR_TESTS
    from .server import ServeOptions, serve
    from .service.socket_dir import EndpointInUse, UnsafeRuntimePath

    if UNCHECKED_FOR_TESTS:
        print(
            "toold: WARNING: TOOLD_TEST_UNCHECKED_PATHS=1 turns the userspace path checks off "
            "(a test setting: only the kernel layer of the tool workers confines paths)",
            file=sys.stderr,
        )
    refused = endpoint_refusal(args.endpoint or config.daemon.endpoint)
    if refused and activated_fd is None:
        print(f"toold: {refused}", file=sys.stderr)
        return 2
    options = ServeOptions(
        roots=args.root,
        endpoint=args.endpoint,
        state_dir=args.state_dir,
        spawner=spawner,
        plugins=plugins,
        activated_fd=activated_fd,
        config_path=args.config.resolve() if args.config else None,
    )
    try:
        trio.run(serve, config, options)
    except EndpointInUse as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 1
    except UnsafeRuntimePath as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    except (JournalError, CannotDrop, StateFileRefused, ConfigError) as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    return 0


def doctor(
    config: Config, spawner: tuple[int, socket.socket], plugins: list[PluginReport], args: argparse.Namespace
) -> int:
    """Each isolation layer as on/off with the reason, then the service checks and the
    plugins (or all of it as one JSON object); exit 1 if something required is off."""
    import json

    import trio

    from .isolation.runner import SpawnRunner
    from .operation.checks import service_checks
    from .server import ServeOptions, state_dir_of

    servers: dict[str, str] = {}

    async def probe() -> dict[str, str]:
        runner = SpawnRunner(*spawner, config)
        try:
            layers = await runner.probe(Probe())
            if config.mcp.servers:
                servers.update(await try_servers(config, runner))
            return layers
        finally:
            runner.close()

    layers = trio.run(probe)
    endpoint = planned_endpoint(config, args.endpoint)
    spawner_socket = args.spawner_socket or config.daemon.spawner_socket
    if not spawner_socket and os.path.exists(SYSTEM_SPAWNER_SOCKET):
        spawner_socket = SYSTEM_SPAWNER_SOCKET  # the installed service's
    state_dir = state_dir_of(config, ServeOptions(state_dir=args.state_dir))
    checks = service_checks(config, endpoint, state_dir, spawner_socket)
    checks += [server_check(name, report) for name, report in servers.items()]
    required_off = [n for n in config.tools.isolation.require if not layers.get(n, "off").startswith("on")]
    required_off += [c.name for c in checks if c.required and not c.on]
    if args.json:
        print(
            json.dumps(
                {
                    "ok": not required_off,
                    "layers": {name: {"on": state.startswith("on"), "detail": state} for name, state in layers.items()},
                    "service": {c.name: {"on": c.on, "detail": c.detail, "required": c.required} for c in checks},
                    "plugins": [report.line() for report in plugins],
                    "required_off": required_off,
                },
                indent=2,
            )
        )
        return 1 if required_off else 0
    width = max(map(len, [*layers, *(c.name for c in checks)]))
    for name, state in sorted(layers.items()):
        on = state.startswith("on")
        detail = (state[2:] if on else state[3:]).strip().removeprefix(":").strip()
        if detail.startswith("(") and detail.endswith(")"):
            detail = detail[1:-1]
        print(f"{name:<{width}}  {'on ' if on else 'off'}  {detail}")
    for check in checks:
        print(f"{check.name:<{width}}  {'on ' if check.on else 'off'}  {check.detail}")
    for report in plugins:
        print(f"plugin {report.line()}")
    if required_off:
        print(f"required but off: {', '.join(required_off)}", file=sys.stderr)
        return 1
    return 0


async def try_servers(config: Config, runner: Any) -> dict[str, str]:
    """Each configured MCP server started once, confined, as the user running doctor."""
    from toold_protocol import Identity

    from .mcp.gateway import trial
    from .sandbox import build_sandbox

    identity = Identity(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
    return await trial(config.mcp, runner, identity, build_sandbox(config, []))


def server_check(name: str, report: str) -> Check:
    """A configured server that starts and lists tools is on; one that does not is a
    required row that is off (its tools cannot be offered)."""
    from .operation.checks import Check

    started = report.endswith("tools") or " tools; " in report
    return Check(f"mcp {name}", started, report or "did not start", required=not started)


def check_config(path: Path) -> int:
    """Exit 0 and a one-line summary for a usable file; 2 and file:line: what is wrong."""
    try:
        config = load_file(path)
    except ConfigError as exc:
        for problem in str(exc).splitlines():
            print(f"toold: {problem}", file=sys.stderr)
        return 2
    approval = config.tools.approval
    policy = approval.preset or approval.mode
    examples = sum(len(r.match) + len(r.not_match) for r in approval.rules)
    print(f"{path}: ok ({len(approval.rules)} policy rules, {examples} rule examples checked, policy {policy})")
    return 0


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request, if this run is one (argcomplete, imported
    only then: it costs start-up time otherwise)."""
    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)


def _completion_script(programs: list[str], shell: str) -> str:
    from argcomplete import shell_integration

    return shell_integration.shellcode(programs, shell=shell)
