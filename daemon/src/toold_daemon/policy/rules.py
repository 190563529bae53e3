"""Checking a policy when it loads: regex guards and each rule's own examples.

A rule may carry ``match = [{...arguments...}]`` and ``not_match = [...]``; they are run
against the rule's conditions like unit tests, and a failing example is a load error,
so a policy cannot silently mean something else than its author wrote. For a shell
command, an allow rule matches when it covers every part of the command (as the engine
judges it); a deny or ask rule when it matches any part.
"""

from __future__ import annotations

from .. import regexguard
from ..config import ApprovalConfig, Rule
from .engine import allows_by_claim_only, conditions_hold, path_is_the_programs
from .shell import split_command
from .shell_parts import Part


def problems(approval: ApprovalConfig) -> list[tuple[int, str]]:
    """Everything wrong with the policy as (rule index, message) pairs (empty: usable)."""
    found: list[tuple[int, str]] = []
    for index, rule in enumerate(approval.rules):
        found.extend((index, f"rule {index} ({rule.decision} {rule.tool}): {p}") for p in _rule_problems(rule))
    return found


def _rule_problems(rule: Rule) -> list[str]:
    found: list[str] = []
    if rule.decision == "allow" and allows_by_claim_only(rule):
        found.append(
            "allows by client name alone, and a client name is only a claim any local process can make; "
            "add uids or gids to the rule"
        )
    for condition in rule.conditions:
        if condition.operator == "matches":
            values = [condition.value] if isinstance(condition.value, str) else condition.value
            found.extend(
                f"{condition.param} matches {v!r}: {why}" for v in values if (why := regexguard.risky(v)) is not None
            )
    if found:
        return found
    for example in rule.match:
        if not _example_matches(rule, example):
            found.append(f"example {example!r} should match but does not")
    for example in rule.not_match:
        if _example_matches(rule, example):
            found.append(f"example {example!r} should not match but does")
    return found


def _example_matches(rule: Rule, example: dict[str, object]) -> bool:
    command = example.get("command")
    if isinstance(command, str) and any(c.param == "command" and c.operator == "prefix" for c in rule.conditions):
        parts = split_command(command)
        if parts is None:
            return False
        hits = [conditions_hold(rule.conditions, {**example, "command": p.text}, part=p) for p in parts]
        if rule.decision == "allow":  # an allow rule covers a command only if it covers every part
            return all(hits) and all(_covered(rule, p) for p in parts)
        return any(hits)
    return conditions_hold(rule.conditions, example)


def _covered(rule: Rule, part: Part) -> bool:
    """Would an allow by ``rule`` stand for this part (no wrapper, redirect, stray path or
    assignment the rule does not name)?"""
    if not part.words or not path_is_the_programs(part):
        return False
    unnamed = [name for name in part.assignments if name not in rule.variables]
    return not (part.opaque or part.wrappers or part.redirects or unnamed)
