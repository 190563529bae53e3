"""``toold``: the daemon's command line (``serve``; more subcommands join later)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from . import __version__
from .config import Config, ConfigError, load_file
from .ipc import EndpointInUse
from .isolation.probe import Probe
from .isolation.spawner import start as start_spawner
from .journal import JournalError
from .server import ServeOptions, serve
from .tools import builtin_tools


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toold", description="Tool-execution daemon for LLM agents")
    parser.add_argument("--version", action="version", version=f"toold {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
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
    serve_cmd.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="toold: %(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = load_file(args.config) if args.config else Config()
    except ConfigError as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    # The fork server starts now, while this process is single-threaded and trio not running.
    spawner = start_spawner([*builtin_tools(), Probe()])
    options = ServeOptions(roots=args.root, endpoint=args.endpoint, state_dir=args.state_dir, spawner=spawner)
    try:
        trio.run(serve, config, options)
    except EndpointInUse as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 1
    except JournalError as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"toold: {exc}", file=sys.stderr)
        return 2
    return 0
