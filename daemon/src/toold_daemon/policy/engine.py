"""The policy engine: (call facts, identity, approval config) → verdict. Pure: no I/O.

Precedence (seed 003 FR-APR-05, with seed 001's rules at step 4):

1. approval ``enabled = false`` → deny ("Tool execution disabled by policy");
2. ``denylist`` → deny;
3. sandbox violations are found by the planner before the policy is asked;
4. rules: tool-specific before ``*``, first match wins; for shell commands every
   simple command of a compound command is judged: any deny denies, any ask (or a
   redirection, or a command that cannot be parsed) asks;
5. otherwise the preset, or ``mode``/``allowlist``/``prompt_side_effects``;
6. a tool's own ``requires_approval`` for these arguments turns an allow into ask.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from toold_protocol import Identity

from ..config import ApprovalConfig, Condition, Rule
from .shell import Part, matches_prefix, split_command

Decision = Literal["allow", "deny", "ask"]
Risk = Literal["low", "medium", "high"]
SHELL_TOOLS = frozenset({"shell", "run_command"})


@dataclass(frozen=True, slots=True)
class Facts:
    """What the policy may know about a call, all derived from its parsed arguments."""

    tool: str
    arguments: Mapping[str, Any]
    side_effecting: bool = False
    risk: Risk = "low"
    requires_approval: bool = False
    #: Whether the default (mode ``prompt`` with ``prompt_side_effects``) asks for this
    #: call: a tool may say no for harmless arguments (write_file creating a new file).
    prompts: bool | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str
    risk: Risk
    rule: int | None = None  # index in approval.rules of the rule that decided
    message: str = ""


MAX_REGEX_SUBJECT_CHARS = 8192  # re.search can be quadratic even for guarded patterns


class _Uncertain(Exception):
    """A condition could not be checked safely; the call must be asked about."""


def evaluate(facts: Facts, identity: Identity, client_name: str, approval: ApprovalConfig) -> Verdict:
    try:
        return _evaluate(facts, identity, client_name, approval)
    except _Uncertain as exc:
        return Verdict("ask", str(exc), _max_risk(facts.risk, "medium"))


def _evaluate(facts: Facts, identity: Identity, client_name: str, approval: ApprovalConfig) -> Verdict:
    if not approval.enabled:
        return Verdict("deny", "Tool execution disabled by policy", facts.risk)
    if facts.tool in approval.denylist:
        return Verdict("deny", f"{facts.tool} is on the approval denylist", facts.risk)
    ruled = _by_rules(facts, identity, client_name, approval)
    verdict = ruled if ruled is not None else _by_mode(facts, approval)
    if verdict.decision == "allow" and facts.requires_approval and approval.preset != "all":
        return Verdict(
            "ask",
            f"{facts.tool} asks for confirmation for these arguments",
            verdict.risk,
            verdict.rule,
            verdict.message,
        )
    return verdict


def _by_mode(facts: Facts, approval: ApprovalConfig) -> Verdict:
    preset = approval.preset
    if preset == "all":
        return Verdict("allow", "preset 'all' runs everything", facts.risk)
    if preset == "none":
        return Verdict("ask", "preset 'none' asks for every call", facts.risk)
    if preset == "safe":
        return (
            Verdict("ask", f"{facts.tool} has side effects (preset 'safe')", facts.risk)
            if facts.side_effecting
            else Verdict("allow", "read-only (preset 'safe')", facts.risk)
        )
    if approval.mode == "deny":
        if facts.tool in approval.allowlist:
            return Verdict("allow", "allowlisted", facts.risk)
        return Verdict("deny", "approval mode is 'deny' and the tool is not allowlisted", facts.risk)
    if approval.mode == "auto" or facts.tool in approval.allowlist:
        return Verdict(
            "allow", "allowlisted" if facts.tool in approval.allowlist else "approval mode is 'auto'", facts.risk
        )
    prompts = facts.side_effecting if facts.prompts is None else facts.prompts
    if prompts and approval.prompt_side_effects:
        return Verdict("ask", f"{facts.tool} has side effects", facts.risk)
    return Verdict("allow", "read-only", facts.risk)


def _by_rules(facts: Facts, identity: Identity, client_name: str, approval: ApprovalConfig) -> Verdict | None:
    candidates = [(i, r) for i, r in enumerate(approval.rules) if _applies_to(r, facts.tool, identity, client_name)]
    ordered = [c for c in candidates if _is_specific(c[1])] + [c for c in candidates if not _is_specific(c[1])]
    if not ordered:
        return None
    command = facts.arguments.get("command")
    if facts.tool in SHELL_TOOLS and isinstance(command, str):
        return _judge_shell(facts, command, ordered)
    for index, rule in ordered:
        if conditions_hold(rule.conditions, facts.arguments):
            return _verdict_of(rule, index, facts)
    return None


def _judge_shell(facts: Facts, command: str, ordered: list[tuple[int, Rule]]) -> Verdict | None:
    parts = split_command(command)
    if parts is None:
        return Verdict("ask", "the command could not be parsed with certainty", _max_risk(facts.risk, "high"))
    decided: list[Verdict] = []
    unmatched = False
    for part in parts:
        verdict = _judge_part(part, facts, ordered)
        if verdict is None:
            unmatched = True
        else:
            decided.append(verdict)
        if part.redirects:
            decided.append(Verdict("ask", f"'{part.text[:60]}' redirects input or output", facts.risk))
        if part.opaque:
            decided.append(Verdict("ask", f"'{part.text[:60]}' runs a program not known in advance", facts.risk))
    for wanted in ("deny", "ask"):
        for verdict in decided:
            if verdict.decision == wanted:
                return verdict
    if unmatched or not decided:
        return None  # some part is not covered by any rule: the mode decides
    return decided[0]


def _judge_part(part: Part, facts: Facts, ordered: list[tuple[int, Rule]]) -> Verdict | None:
    arguments = {**facts.arguments, "command": part.text}
    for index, rule in ordered:
        if conditions_hold(rule.conditions, arguments, part=part):
            return _verdict_of(rule, index, facts)
    return None


def _verdict_of(rule: Rule, index: int, facts: Facts) -> Verdict:
    reason = rule.message or f"rule {index} ({rule.decision} {_tools(rule)})"
    return Verdict(rule.decision, reason, rule.risk or facts.risk, index, rule.message)


def _is_specific(rule: Rule) -> bool:
    names = [rule.tool] if isinstance(rule.tool, str) else rule.tool
    return "*" not in names


def _tools(rule: Rule) -> str:
    return rule.tool if isinstance(rule.tool, str) else ",".join(rule.tool)


def _applies_to(rule: Rule, tool: str, identity: Identity, client_name: str) -> bool:
    names = [rule.tool] if isinstance(rule.tool, str) else rule.tool
    if "*" not in names and tool not in names:
        return False
    if rule.uids and identity.uid not in rule.uids:
        return False
    if rule.gids and identity.gid not in rule.gids:
        return False
    return not (rule.clients and client_name not in rule.clients)


def conditions_hold(conditions: list[Condition], arguments: Mapping[str, Any], *, part: Part | None = None) -> bool:
    return all(_holds(c, arguments, part) for c in conditions)


def _holds(condition: Condition, arguments: Mapping[str, Any], part: Part | None) -> bool:
    if condition.param not in arguments:
        return False
    raw = arguments[condition.param]
    text = raw if isinstance(raw, str) else str(raw)
    values = [condition.value] if isinstance(condition.value, str) else condition.value
    match condition.operator:
        case "equals":
            return text in values
        case "contains":
            return any(v in text for v in values)
        case "startsWith":
            return any(text.startswith(v) for v in values)
        case "prefix":
            words = part if part is not None and condition.param == "command" else Part(tuple(text.split()))
            return any(matches_prefix(words, v) for v in values)
        case "matches":
            if len(text) > MAX_REGEX_SUBJECT_CHARS:
                raise _Uncertain(
                    f"{condition.param} is longer than {MAX_REGEX_SUBJECT_CHARS} characters; "
                    "a pattern rule cannot be checked against it"
                )
            return any(re.search(v, text) is not None for v in values)


def _max_risk(a: Risk, b: Risk) -> Risk:
    order = {"low": 0, "medium": 1, "high": 2}
    return a if order[a] >= order[b] else b
