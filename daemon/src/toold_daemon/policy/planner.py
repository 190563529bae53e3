"""Planning a batch: for each call, in order, decide whether it can run.

Checks, in order: batch size limit, duplicate call id, tools mode, tool exists,
argument size, arguments decode into the tool's type (the schema check), the tool's
own validation, sandbox preflight of path arguments, and the policy. A failed check
pre-resolves that call with an error result; the rest of the batch goes on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from toold_protocol import Identity, ToolCall, ToolErrorType, ToolResult

from .. import policy
from ..config import Config
from ..errors import ToolError, bad_args, limits_exceeded, sandbox_violation
from ..execution import results
from ..execution.batches import PreparedCall
from ..redaction import hide_secrets
from ..sandbox import Sandbox
from ..sandbox.named import denied_words
from ..sandbox.paths import remembering_missing
from ..tools import Tool
from ..tools.registry import Registry
from .engine import COMMAND_TOOLS

SUMMARY_CHARS = 200


def redact(text: str) -> str:
    """Hide values that look like credentials, and keep summaries short."""
    text = hide_secrets(text)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


class Planner(msgspec.Struct, frozen=True):
    """Plans calls for one client session: what every check needs, gathered once."""

    registry: Registry
    sandbox: Sandbox
    config: Config
    identity: Identity
    client_name: str = ""
    grants: frozenset[str] = frozenset()  # the session's "allow for this session" answers

    def plan(self, calls: Sequence[ToolCall], *, turn_iteration: int = 1) -> list[PreparedCall]:
        """Plan every call in order. ``turn_iteration`` counts this batch among the batches
        of its user turn; past the limit every call is pre-resolved. A call the
        policy asks about is marked ``needs_confirmation`` unless a grant covers it."""
        with remembering_missing():  # (nothing the plan names is made while it is planned)
            return self._plan(calls, turn_iteration)

    def _plan(self, calls: Sequence[ToolCall], turn_iteration: int) -> list[PreparedCall]:
        seen: set[str] = set()
        prepared: list[PreparedCall] = []
        max_iterations = self.config.tools.max_tool_iterations_per_user_turn
        changes_before = False
        for index, call in enumerate(calls):
            item = PreparedCall(index=index, call_id=call.call_id, name=call.name, tool=None, args=None)
            try:
                if turn_iteration > max_iterations:
                    raise limits_exceeded(
                        f"this is tool batch {turn_iteration} of the same user turn, over "
                        f"max_tool_iterations_per_user_turn={max_iterations}; this call was not run",
                        limit=max_iterations,
                    )
                # once an earlier call may change the files, the disk as it is now says
                # nothing certain about this one: its tool checks when it runs
                self._check(item, call, seen=seen, precheck=not changes_before)
            except ToolError as exc:
                item.result = self._failure(call.call_id, exc)
            seen.add(call.call_id)
            prepared.append(item)
            # a call refused while planning (denied, invalid) changes nothing
            may_change = item.tool is not None and item.tool.side_effecting and item.result is None
            changes_before = changes_before or may_change
        return prepared

    def explain(self, call: ToolCall) -> tuple[str, str, str, int | None]:
        """(decision, reason, risk, rule) for one call, planned exactly as a batch would be;
        decision ``invalid`` when the call would not get as far as the policy."""
        item = PreparedCall(index=0, call_id=call.call_id, name=call.name, tool=None, args=None)
        try:
            self._check(item, call, seen=set())
        except ToolError as exc:
            if exc.code == "DENIED_BY_POLICY":
                return "deny", exc.message, item.risk, exc.details.get("rule")
            return "invalid", exc.message, item.risk, None
        decision = "ask" if item.needs_confirmation else "allow"
        return decision, item.policy_reason, item.risk, item.policy_rule

    def replan(self, item: PreparedCall, arguments: msgspec.Raw) -> None:
        """Re-plan a call with arguments a person supplied while approving it:
        decoded, validated and sandbox-checked like the original; a policy deny still
        denies, an ask does not ask again (the person has just answered). Errors become its
        result."""
        call = ToolCall(call_id=item.call_id, name=item.name, arguments=arguments)
        item.resolved = {}
        try:
            self._check(item, call, seen=set(), approved=True, precheck=False)
        except ToolError as exc:
            item.result = None
            item.denial = self._failure(call.call_id, exc)

    def _failure(self, call_id: str, exc: ToolError) -> ToolResult:
        """A call refused while planning, within the configured output limits."""
        limits = self.config.tools.output
        return results.failure(call_id, exc, max_bytes=limits.max_bytes, max_lines=limits.max_lines)

    def _check(
        self, item: PreparedCall, call: ToolCall, *, seen: set[str], approved: bool = False, precheck: bool = True
    ) -> None:
        tools = self.config.tools
        if item.index >= tools.max_tool_calls_per_batch:
            raise limits_exceeded(
                f"batch has more than {tools.max_tool_calls_per_batch} calls (max_tool_calls_per_batch); "
                "this call was not run",
                limit=tools.max_tool_calls_per_batch,
            )
        if call.call_id in seen:
            raise ToolError(
                ToolErrorType.DUPLICATE_TOOL_CALL_ID,
                "DUPLICATE_TOOL_CALL_ID",
                f"call id {call.call_id!r} is used twice in this batch",
                call_id=call.call_id,
            )
        if tools.mode == "disabled":
            raise sandbox_violation("TOOLS_DISABLED", "tools are disabled on this daemon (tools.mode = 'disabled')")
        tool = self.registry.get(call.name)
        withheld = self.registry.why_withheld(call.name) if tool is None else None
        if withheld is not None:
            raise ToolError(ToolErrorType.UNKNOWN_TOOL, "TOOL_NOT_CONFIGURED", withheld, name=call.name)
        unlisted = self.registry.why_unlisted(call.name, self.identity.uid) if tool is None else None
        if unlisted is not None:
            raise ToolError(ToolErrorType.SANDBOX_VIOLATION, "LIMITS_EXCEEDED", unlisted, name=call.name[:128])
        if tool is None:
            raise ToolError(
                ToolErrorType.UNKNOWN_TOOL, "UNKNOWN_TOOL", f"Unknown tool: {call.name[:128]!r}", name=call.name[:128]
            )
        item.tool, item.name, item.risk = tool, tool.name, tool.risk
        self._refuse_disabled_or_denylisted(tool)
        size = len(call.arguments)
        if tool.max_args_bytes is not None and size > tool.max_args_bytes:
            raise limits_exceeded(
                f"arguments are {size} bytes, over the {tool.max_args_bytes} bytes one {tool.name} call may carry",
                limit=tool.max_args_bytes,
                size=size,
            )
        if tool.max_args_bytes is None and size > tools.max_tool_args_bytes:
            raise limits_exceeded(
                f"arguments are {size} bytes, over max_tool_args_bytes={tools.max_tool_args_bytes}",
                limit=tools.max_tool_args_bytes,
                size=size,
            )
        try:
            item.args = msgspec.msgpack.decode(call.arguments, type=tool.args_type)
        except msgspec.ValidationError as exc:
            raise bad_args(_invalid_arguments(tool.name, call.arguments, exc)) from None
        except msgspec.DecodeError as exc:
            raise bad_args(f"arguments of {tool.name} are not a MessagePack map: {exc}") from None
        except RecursionError:
            raise bad_args(f"arguments of {tool.name} are nested too deeply") from None
        tool.validate(item.args)
        item.summary = redact(tool.summary(item.args))
        item.locations = tool.locations(item.args)
        for raw in tool.paths(item.args):
            item.resolved[raw] = self.sandbox.resolve(raw, follow_last=tool.follows_last_symlink)
        if tools.mode == "parse_only":
            item.awaiting_result = True  # nothing runs: a person supplies the result (supply_result)
            return
        if precheck:
            tool.precheck(item.args, item.resolved, self.config)  # never ask about a call certain to fail
        facts = policy.Facts(
            tool=tool.name,
            arguments=msgspec.to_builtins(item.args),
            side_effecting=tool.side_effecting,
            risk=tool.risk_for(item.args),
            requires_approval=tool.requires_approval(item.args),
            prompts=tool.prompts(item.args, item.resolved, self.config),
            protected=self._protected_target(tool, item),
            names_denied=self._denied_in_command(tool, item),
            high_risk_tool=tool.high_risk(item.args),
        )
        verdict = policy.evaluate(facts, self.identity, self.client_name, tools.approval)
        item.risk = verdict.risk
        item.policy_rule = verdict.rule
        if verdict.decision == "deny":
            item.policy_reason = verdict.reason
            raise ToolError(
                ToolErrorType.DENIED, "DENIED_BY_POLICY", f"{tool.name} denied: {verdict.reason}", rule=verdict.rule
            )
        granted = verdict.decision == "ask" and grant_key(item) in self.grants
        item.needs_confirmation = verdict.decision == "ask" and not approved and not granted
        item.policy_reason = "allowed for this session by an earlier answer" if granted else verdict.reason

    def _refuse_disabled_or_denylisted(self, tool: Tool[Any]) -> None:
        """First in the order of precedence, before any path is looked at: a denylisted
        call with a bad path reports the denylist."""
        approval = self.config.tools.approval
        if not approval.enabled:
            raise ToolError(
                ToolErrorType.DENIED, "DENIED_BY_POLICY", f"{tool.name} denied: Tool execution disabled by policy"
            )
        if tool.name in approval.denylist:
            raise ToolError(
                ToolErrorType.DENIED, "DENIED_BY_POLICY", f"{tool.name} denied: {tool.name} is on the approval denylist"
            )

    def _protected_target(self, tool: Tool[Any], item: PreparedCall) -> str | None:
        """ "PATH (pattern)" when a built-in write would touch a place other programs run
        code from (``.git/hooks``, ``.envrc``, ``.vscode/tasks.json`` …); commands are
        kept out of those by a read-only mount instead."""
        if not tool.side_effecting or tool.name in COMMAND_TOOLS:
            return None
        for raw, path in item.resolved.items():
            pattern = self.sandbox.protected_pattern(path)
            if pattern is not None:
                return f"{raw[:120]} (protected: {pattern})"
        return None

    def _denied_in_command(self, tool: Tool[Any], item: PreparedCall) -> str | None:
        """For a shell command: the first of its words that names a denied file."""
        if tool.name not in policy.SHELL_TOOLS:
            return None
        arguments = msgspec.to_builtins(item.args)
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if not isinstance(command, str):
            return None
        parts = policy.split_command(command)
        if parts is None:
            return None  # unreadable commands are asked about anyway
        cwd = arguments.get("cwd")
        base = item.resolved.get(cwd) if isinstance(cwd, str) else None
        words = (word for part in parts for word in part.words)
        return denied_words(self.sandbox, words, str(base or self.sandbox.working_dir))


def grant_key(item: PreparedCall) -> str:
    """What an "allow for this session" answer covers, never broader: the tool plus its
    exact canonical paths, or for a shell command the one program every part runs, keyed
    after assignments and wrappers (``FOO=1 nice git`` is ``nice>git`` setting FOO, not
    ``FOO=1``) and never for a program named by a path PATH would not find."""
    if item.tool is None:
        return ""
    scope = item.tool.grant_scope(item.args)
    if scope is not None:
        return scope
    arguments = msgspec.to_builtins(item.args)
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if item.tool.name in policy.SHELL_TOOLS and isinstance(command, str):
        parts = policy.split_command(command)
        if not parts or any(p.opaque or p.redirects or not policy.path_is_the_programs(p) for p in parts):
            return ""
        programs = {(">".join([*p.wrappers, p.program]), ",".join(sorted(set(p.assignments)))) for p in parts}
        if len(programs) != 1:
            return ""
        program, variables = programs.pop()
        return f"shell:{program}" + (f" setting {variables}" if variables else "")
    paths = sorted(str(p) for p in item.resolved.values())
    return f"{item.tool.name}:" + "\0".join(paths) if paths else ""


def _invalid_arguments(name: str, arguments: bytes, error: msgspec.ValidationError) -> str:
    """Why arguments were refused; arguments that came as text (a provider's JSON the
    client could not decode) say so, with where that JSON breaks."""
    try:
        given = msgspec.msgpack.decode(arguments)
    except msgspec.DecodeError:
        given = None
    if not isinstance(given, str):
        return f"invalid arguments for {name}: {error}"
    try:
        json.loads(given)
        why = "it is JSON, but not an object"
    except ValueError as exc:
        why = f"it is not valid JSON ({exc})"
    shown = given if len(given) <= 200 else given[:200] + "…"
    return f"the arguments for {name} must be a JSON object; the model sent text instead, and {why}: {shown!r}"
