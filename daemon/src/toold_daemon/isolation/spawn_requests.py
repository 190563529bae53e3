"""What the spawner is asked for: a ``SpawnRequest`` per call, built from the call, the
client's identity and the daemon's configuration.

The parts every request shares are worked out once: the configuration's encoding, the
environment inherited from the daemon (filtered by the allow and deny lists, without the
search key), the resource limits.
"""

from __future__ import annotations

import os
import pwd
from typing import Any

import msgspec

from toold_protocol import Identity

from ..config import Config
from ..sandbox.environment import acceptable, inherited_environment, is_injection
from ..tools._base import Command, Tool, ToolContext
from . import sweep as sweeping
from .wire import Limits, SpawnRequest

_encoder = msgspec.msgpack.Encoder()


class SpawnRequests:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.config_bytes = _encoder.encode(config)
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
        #: The service's own groups (the socket's, the service user's): never a tool's.
        self.service_gids: frozenset[int] = frozenset()

    def command_request(
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
            config=self.config_bytes,
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

    def tool_request(
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

    def network_mode(self, tool_name: str, request: SpawnRequest) -> SpawnRequest:
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
