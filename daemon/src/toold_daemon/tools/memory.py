"""memory: remember things across sessions, per user (or per user and workspace).

Runs in the daemon, which keeps the store (``user_state``); the rows are keyed by the
caller's kernel uid and the scope the session gives, never by anything in the call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..config import Config
from ..errors import ToolError, bad_args, limits_exceeded
from ..records.user_state import Full, UserState
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import MemoryData

_PREVIEW_CHARS = 100


class MemoryArgs(ToolArgs, frozen=True):
    """Remember, recall, forget or list facts."""

    action: Annotated[Literal["get", "set", "delete", "list"], Meta(description="get, set, delete or list")]
    key: Annotated[str, Meta(max_length=4096, description="The key (get, set, delete)")] = ""
    value: Annotated[str, Meta(description="The value to store (set)")] | None = None
    scope: Annotated[
        Literal["user", "workspace"],
        Meta(description="user: everywhere you work (default); workspace: this workspace only"),
    ] = "user"


class Memory(Tool[MemoryArgs]):
    name = "memory"
    description = (
        "A persistent key-value memory across sessions: set a key to a value, get it, delete it, or list "
        "the keys. scope 'user' is shared by all your sessions; 'workspace' only by this workspace's."
    )
    args_type = MemoryArgs
    side_effecting = True  # it changes stored state, but asks nobody under the default policy
    in_daemon = True
    data_type = MemoryData
    output = "data: get {key, value, found}; set {key, created}; delete {key, deleted}; list {keys}"

    def validate(self, args: MemoryArgs) -> None:
        if args.action in ("get", "set", "delete") and not args.key:
            raise bad_args(f"action {args.action!r} needs a key")
        if args.action == "set" and args.value is None:
            raise bad_args("action 'set' needs a value")

    def summary(self, args: MemoryArgs) -> str:
        where = "" if args.scope == "user" else " (workspace)"
        return f"Memory: {args.action} {args.key[:120]}{where}".replace("  ", " ").strip()

    def prompts(self, args: MemoryArgs, resolved: dict[str, Path], config: Config) -> bool:
        return False

    def run(self, args: MemoryArgs, ctx: ToolContext) -> ToolOutput:
        state, uid, scope = _store(ctx), ctx.identity.uid, scope_of(args.scope, ctx)
        limits = ctx.config.tools.memory
        if len(args.key) > limits.max_key_chars:
            raise limits_exceeded(f"the key has {len(args.key)} characters (max_key_chars = {limits.max_key_chars})")
        if args.action == "get":
            value = state.get(uid, scope, args.key)
            if value is None:
                return ToolOutput(f"not found: {args.key}", data={"key": args.key, "value": None, "found": False})
            return ToolOutput(value, data={"key": args.key, "value": value, "found": True})
        if args.action == "set":
            assert args.value is not None
            size = len(args.value.encode("utf-8", "surrogatepass"))
            if size > limits.max_value_bytes:
                raise limits_exceeded(f"the value is {size} bytes (max_value_bytes = {limits.max_value_bytes})")
            try:
                created = state.set(
                    uid, scope, args.key, args.value, max_keys=limits.max_keys, max_bytes=limits.max_bytes_per_user
                )
            except Full as exc:
                raise limits_exceeded(str(exc)) from None
            return ToolOutput(
                f"{'stored' if created else 'updated'} {args.key}", data={"key": args.key, "created": created}
            )
        if args.action == "delete":
            deleted = state.delete(uid, scope, args.key)
            shown = f"deleted {args.key}" if deleted else f"not found: {args.key}"
            return ToolOutput(shown, data={"key": args.key, "deleted": deleted})
        entries = state.entries(uid, scope)
        lines = [f"{key}: {_preview(value)}" for key, value in entries]
        return ToolOutput("\n".join(lines) if lines else "no keys stored", data={"keys": [k for k, _ in entries]})


def scope_of(scope: str, ctx: ToolContext) -> str:
    """``user``, or ``workspace:ROOT`` for the session's (first) root."""
    return "user" if scope == "user" else f"workspace:{ctx.sandbox.roots[0]}"


def _store(ctx: ToolContext) -> UserState:
    if not isinstance(ctx.user_state, UserState) or ctx.identity is None:
        raise ToolError(ToolErrorType.ISOLATION_UNAVAILABLE, "NO_STATE", "this daemon keeps no memory or todos")
    return ctx.user_state


def _preview(value: str) -> str:
    flat = " ".join(value.split())
    return flat if len(flat) <= _PREVIEW_CHARS else flat[: _PREVIEW_CHARS - 1] + "…"
