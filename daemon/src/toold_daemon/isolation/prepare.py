"""What the spawner works out before it forks, so that each child only applies it.

Decoding the configuration, building the sandbox (compiled deny patterns), decoding a
tool's arguments for the first time (msgspec builds its type info lazily) and building a
Landlock ruleset each cost milliseconds. Done in the spawner and cached, they are
inherited by every child through fork for free.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..config import Config
from ..sandbox import Sandbox, build_sandbox
from ..tools._base import Tool
from . import kernel
from .confine import landlock_ruleset, supplementary_groups
from .roots import roots_identity
from .wire import SpawnRequest

log = logging.getLogger(__name__)
_CACHE_SIZE = 16
K = TypeVar("K")
V = TypeVar("V")


class Work(msgspec.Struct):
    tool: Tool[Any] | None
    args: Any
    config: Config | None
    sandbox: Sandbox | str | None  # a string: why the roots could not be resolved
    landlock: int | str  # a ruleset fd (the child's copy is closed after use) or why not
    tools: dict[str, Tool[Any]] = msgspec.field(default_factory=dict)  # what a tool worker may run
    groups: list[int] | None = None  # the client's groups, looked up here (``supplementary_groups``)


class Preparer:
    def __init__(self, tools: dict[str, Tool[Any]]) -> None:
        self.tools = tools
        self._configs: OrderedDict[bytes, Config] = OrderedDict()
        self._sandboxes: OrderedDict[tuple[bytes, tuple[str, ...]], Sandbox | str] = OrderedDict()
        self._rulesets: OrderedDict[tuple[object, ...], int | str] = OrderedDict()
        if kernel.seccomp_supported() is None:
            kernel.seccomp_program(sockets="none")
            kernel.seccomp_program(sockets="any")
        msgspec.msgpack.decode(msgspec.msgpack.encode(Config()), type=Config)
        self.warmed = False

    def warm(self) -> None:
        """Let each tool build what its first call would (web_fetch's HTTP stack: a fifth
        of a second), once, so that every child forked after inherits it. The spawner does
        this once it has had nothing to serve for a while, never before its first request:
        the daemon's start waits on that request (the isolation probe), and neither it nor
        a client's first call should wait on the warming."""
        if not self.warmed:
            self.warmed = True
            for tool in self.tools.values():
                try:
                    tool.warm()
                except Exception as exc:  # a plugin's: its calls still run, unwarmed; the spawner serves on
                    log.warning("warming %s failed: %s: %s", tool.name, type(exc).__name__, exc)

    def prepare(self, request: SpawnRequest) -> Work:
        """Raises ValueError (or msgspec errors) for a request the spawner cannot serve."""
        runs_a_tool = not (request.argv or request.worker or request.zygote)  # else a program, or many calls
        tool = self.tools.get(request.tool) if runs_a_tool else None
        if runs_a_tool and tool is None:
            raise ValueError(f"unknown tool {request.tool!r}")
        config = self._config(request.config) if request.config else None
        args = msgspec.msgpack.decode(request.args, type=tool.args_type) if tool is not None else None
        sandbox = self._sandbox(request.config, config, request.roots) if config is not None else None
        ruleset = self._ruleset(
            request.roots,
            request.writable,
            request.readable,
            request.network or request.egress_proxy,  # commands reach the proxy by TCP on loopback
            tools_only=request.worker,
            narrow=request.narrow_reads,
        )
        groups = supplementary_groups(request.uid, request.gid)
        return Work(tool, args, config, sandbox, ruleset, self.tools if request.worker else {}, groups)

    def _config(self, data: bytes) -> Config:
        return _cached(self._configs, data, lambda: msgspec.msgpack.decode(data, type=Config))

    def _sandbox(self, key: bytes, config: Config, roots: list[str]) -> Sandbox | str:
        def build() -> Sandbox | str:
            try:
                return build_sandbox(config, [Path(r) for r in roots])
            except (OSError, ValueError) as exc:
                return str(exc)

        return _cached(self._sandboxes, (key, tuple(roots)), build)

    def _ruleset(
        self,
        roots: list[str],
        writable: list[str],
        readable: list[str],
        network: bool,
        *,
        tools_only: bool,
        narrow: bool = False,
    ) -> int | str:
        # The roots' identities too: a root removed and made again is another directory,
        # which a ruleset made for the old one would refuse.
        flags = (str(network), str(tools_only), str(narrow))
        key = (tuple(roots), tuple(writable), tuple(readable), flags, roots_identity(roots))
        if key not in self._rulesets and len(self._rulesets) >= _CACHE_SIZE:
            _, old = self._rulesets.popitem(last=False)
            if isinstance(old, int):
                os.close(old)
        return _cached(
            self._rulesets,
            key,
            lambda: landlock_ruleset(
                roots, writable, network=network, tools_only=tools_only, readable=readable, narrow=narrow
            ),
        )


def _cached(cache: OrderedDict[K, V], key: K, build: Callable[[], V]) -> V:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = build()
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value
