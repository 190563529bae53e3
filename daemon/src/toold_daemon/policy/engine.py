"""The policy engine: (call facts, identity, approval config) → verdict. Pure: no I/O.

Precedence:

1. approval ``enabled = false`` → deny ("Tool execution disabled by policy");
2. ``denylist`` → deny;
3. sandbox violations are found by the planner before the policy is asked;
   A command whose words name a denied file is asked about whatever follows.
4. rules: tool-specific before ``*``, first match wins; for shell commands every
   simple command of a compound command is judged: any deny denies, any ask (or a
   redirection, or a command that cannot be parsed) asks;
5. otherwise the preset, or ``mode``/``allowlist``/``prompt_side_effects``; a tool that
   is high-risk in itself (``delete_file``, ``shell``, ``run_code``) asks even when these
   allow it, unless it is allowlisted or the preset is "all";
6. a tool's own ``requires_approval`` for these arguments turns an allow into ask.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from toold_protocol import Identity

from ..config import ApprovalConfig, Condition, Rule
from ..redaction import show_blanks
from ..sandbox.environment import DEFAULT_PATH
from .options import hazards, rule_names_option
from .shell import read_command
from .shell_parts import Part, Unreadable, matches_prefix

Decision = Literal["allow", "deny", "ask"]
Risk = Literal["low", "medium", "high"]
SHELL_TOOLS = frozenset({"shell", "run_command"})
COMMAND_TOOLS = SHELL_TOOLS | {"run_code", "shell_jobs"}


class Facts(msgspec.Struct, frozen=True):
    """What the policy may know about a call, all derived from its parsed arguments."""

    tool: str
    arguments: Mapping[str, Any]
    side_effecting: bool = False
    risk: Risk = "low"
    requires_approval: bool = False
    #: Whether the default (mode ``prompt`` with ``prompt_side_effects``) asks for this
    #: call: a tool may say no for harmless arguments (write_file creating a new file).
    prompts: bool | None = None
    #: A path this call writes where other programs run code from (``.git/hooks/…``,
    #: ``~/.gitconfig``): asked about in every mode and preset, unless an allowing rule
    #: with a condition on the path decided.
    protected: str | None = None
    #: A denied file a command's words name (``cat .env``): asked about whatever the
    #: rules or the preset say; a deny rule still denies.
    names_denied: str | None = None
    #: The tool itself is high-risk (delete_file, shell, run_code): it asks even in mode
    #: "auto" unless the administrator named it (allowlist, an allow rule, preset "all").
    high_risk_tool: bool = False


class Verdict(msgspec.Struct, frozen=True):
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
    if verdict.decision != "deny" and facts.names_denied:
        return Verdict("ask", f"the command names a denied file: {facts.names_denied}", "high", verdict.rule)
    if (
        verdict.decision == "allow"
        and facts.high_risk_tool
        and ruled is None
        and facts.tool not in approval.allowlist
        and approval.preset != "all"
    ):
        why = (
            f"{facts.tool} is a high-risk tool: it runs unasked only if the allowlist, a rule or preset 'all' names it"
        )
        return Verdict("ask", why, facts.risk)
    if verdict.decision != "deny" and facts.protected and not _allowed_by_path(ruled, approval):
        return Verdict("ask", f"{facts.tool} writes {facts.protected}", _max_risk(verdict.risk, "high"))
    if verdict.decision == "allow" and facts.requires_approval and approval.preset != "all":
        return Verdict(
            "ask",
            f"{facts.tool} asks for confirmation for these arguments",
            verdict.risk,
            verdict.rule,
            verdict.message,
        )
    return verdict


#: Arguments that name the files a built-in tool writes.
PATH_PARAMETERS = frozenset({"path", "paths", "source", "destination"})


def _allowed_by_path(ruled: Verdict | None, approval: ApprovalConfig) -> bool:
    """Whether an allowing rule with a condition on the path decided: the only word that
    lets a write into a protected location go unasked (no mode or preset does)."""
    if ruled is None or ruled.decision != "allow" or ruled.rule is None:
        return False
    rule = approval.rules[ruled.rule]
    return any(condition.param in PATH_PARAMETERS for condition in rule.conditions)


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
    if not facts.side_effecting:
        return Verdict("allow", "read-only", facts.risk)
    if not approval.prompt_side_effects:
        return Verdict("allow", "prompt_side_effects is off: calls with side effects run unasked", facts.risk)
    return Verdict(
        "allow", f"{facts.tool} creates something new here and replaces nothing (it asks only to replace)", facts.risk
    )


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
    try:
        parts = read_command(command)
    except Unreadable as exc:
        return Verdict("ask", f"the command could not be read with certainty: {exc}", _max_risk(facts.risk, "high"))
    decided: list[Verdict] = []
    unmatched = False
    for part in parts:
        verdict = _judge_part(part, facts, ordered)
        if verdict is None:
            unmatched = True
        else:
            decided.append(verdict)
        decided.extend(Verdict("ask", why, facts.risk) for why in part_concerns(part, verdict, ordered))
    for wanted in ("deny", "ask"):
        for verdict in decided:
            if verdict.decision == wanted:
                return verdict
    if unmatched or not decided:
        return None  # some part is not covered by any rule: the mode decides
    return decided[0]


def part_concerns(part: Part, verdict: Verdict | None, ordered: list[tuple[int, Rule]]) -> list[str]:
    """Why a part must be asked about whatever rule matched its program."""
    shown = part.text[:80]
    concerns: list[str] = []
    if part.opaque:
        concerns.append(f"'{shown}': {part.why_opaque or 'runs a program not known in advance'}")
    if part.wrappers:
        concerns.append(f"'{shown}' runs through {', '.join(part.wrappers)}")
    if part.assignments:
        named = set(_rule_of(verdict, ordered).variables) if verdict is not None else set()
        unnamed = [name for name in part.assignments if name not in named]
        if unnamed:
            concerns.append(f"'{shown}' sets {', '.join(unnamed)} before running")
    if part.redirects:
        concerns.append(f"'{shown}' redirects input or output")
    rule_words = _command_words(_rule_of(verdict, ordered)) if verdict is not None else []
    for hazard in hazards(part.words):
        if not rule_names_option(rule_words, hazard):
            concerns.append(f"'{shown}': {hazard.describe(part.program)}")
    return concerns


def _command_words(rule: Rule) -> list[str]:
    """The words of a rule's conditions on the command (what it names)."""
    words: list[str] = []
    for condition in rule.conditions:
        if condition.param == "command":
            values = [condition.value] if isinstance(condition.value, str) else condition.value
            words += [word for value in values for word in value.split()]
    return words


def _rule_of(verdict: Verdict, ordered: list[tuple[int, Rule]]) -> Rule:
    return next((rule for index, rule in ordered if index == verdict.rule), Rule(decision="ask"))


def _judge_part(part: Part, facts: Facts, ordered: list[tuple[int, Rule]]) -> Verdict | None:
    """The first rule that matches this part. An allow rule never matches a program named
    by a path other than the one PATH finds (``./rm``, ``/tmp/x/rm`` are not ``rm``)."""
    if not part.words:
        return None
    arguments = {**facts.arguments, "command": part.text}
    trusted = path_is_the_programs(part)
    for index, rule in ordered:
        if rule.decision == "allow" and not trusted:
            continue
        if conditions_hold(rule.conditions, arguments, part=part):
            return _verdict_of(rule, index, facts)
    return None


def path_is_the_programs(part: Part) -> bool:
    """True unless the command word is a path other than where PATH finds the program."""
    explicit = part.explicit_path
    if explicit is None:
        return True
    if not explicit.startswith("/"):
        return False
    found = shutil.which(part.program, path=DEFAULT_PATH)
    return found is not None and os.path.realpath(found) == os.path.realpath(explicit)


def _verdict_of(rule: Rule, index: int, facts: Facts) -> Verdict:
    reason = rule.message or f"rule {index} ({rule.decision} {_tools(rule)})"
    if rule.decision == "allow" and allows_by_claim_only(rule):
        return Verdict(
            "ask", f"{reason} names clients but no uids or gids: a client name is a claim", facts.risk, index
        )
    return Verdict(rule.decision, reason, rule.risk or facts.risk, index, rule.message)


def allows_by_claim_only(rule: Rule) -> bool:
    """An allow rule scoped by ``clients`` alone: any local process may send that name."""
    return bool(rule.clients) and not rule.uids and not rule.gids


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


def describe_command(command: str) -> list[str]:
    """For a person deciding: the whole command (runs of blanks shown by count, so
    padding cannot push its tail out of view), then each simple command it runs and why
    that one asks."""
    lines = [f"command: {show_blanks(command)}"]
    try:
        parts = read_command(command)
    except Unreadable as exc:
        return [*lines, f"cannot be read with certainty: {exc}"]
    for part in parts:
        concerns = part_concerns(part, None, [])
        shown = show_blanks(" ".join(part.words)) if part.words else "(no program)"
        lines.append(f"runs: {shown}" + (f" — {'; '.join(c.split(': ', 1)[-1] for c in concerns)}" if concerns else ""))
    return lines
