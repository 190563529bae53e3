"""Class A: the command policy must see what the shell will run.

Each test names the attack it tries. The differential test at the end does not trust
the reader at all: it runs generated commands under real shells (dash and bash) in an
empty directory where every program is a logging stub, and checks that each program
that actually ran was one the policy judged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toold_daemon.config import ApprovalConfig, Condition, Rule
from toold_daemon.policy import Facts, evaluate, split_command
from toold_protocol import Identity

ME = Identity(uid=os.getuid(), gid=os.getgid(), pid=1)


def rule(decision: str, prefixes: list[str], **extra: object) -> Rule:
    condition = Condition(param="command", operator="prefix", value=prefixes)
    return Rule(decision=decision, tool="shell", conditions=[condition], **extra)  # type: ignore[arg-type]


def decide(command: str, *rules: Rule) -> str:
    approval = ApprovalConfig(mode="prompt", rules=list(rules))
    facts = Facts(tool="shell", arguments={"command": command}, side_effecting=True, risk="high")
    return evaluate(facts, ME, "", approval).decision


ECHO_ALLOWED = rule("allow", ["echo", "ls", "git status"])
RM_DENIED = rule("deny", ["rm"])


# ---- comments and quoting --------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "echo hi #'\nrm -rf x\n#'",  # the review's example: a quote inside a comment is no quote
        'echo hi #"\nrm -rf x\n#"',
        "echo hi #`\nrm -rf x\n#`",
        "echo hi # $(\nrm -rf x\n# )",
        "ls;#'\nrm -rf x\n#'",
        "echo hi \\\n#'\nrm -rf x\n#'",
    ],
)
def test_a_quote_inside_a_comment_does_not_hide_the_next_line(command: str) -> None:
    """Attack: a comment that ends in a quote, so a naive splitter reads the next lines as
    one quoted word and never sees the command between them."""
    parts = split_command(command)
    assert parts is not None
    assert "rm" in [p.program for p in parts]
    assert decide(command, ECHO_ALLOWED) == "ask"
    assert decide(command, ECHO_ALLOWED, RM_DENIED) == "deny"


@pytest.mark.parametrize("command", ["echo a#'b'", "echo a#b; ls"])
def test_a_hash_inside_a_word_is_not_a_comment(command: str) -> None:
    """A `#` in the middle of a word is a character; the rest of the line is still read."""
    parts = split_command(command)
    assert parts is not None and parts[0].words[1].startswith("a#")


@pytest.mark.parametrize(
    "command",
    [
        "echo $'\\x3b' ; ls",
        'echo $"x"',
        "echo 'unbalanced",
        'echo "unbalanced',
        "echo x\uff1b rm -rf y",  # fullwidth semicolon
        "echo x \u2223 rm",  # divides, looks like a pipe
        "echo x\u037e rm",  # Greek question mark = ';' after NFKC
        "echo x\u200b; ls",  # zero-width space
        "echo x\r; rm y",
        "echo \x08\x08rm",
        "echo {rm,-rf,x}",
        "{rm,-rf,x}",
        "echo $((1+1))",
        "if true; then rm x; fi",
        "{ rm x; }",
        "f() { rm x; }; f",
        "a[$(rm x)]=1",
        "read 'a[$(rm x)]' <<< 1",
        "diff <(ls a) <(ls b)",
        "echo ${x:-$(rm y)}",
        "cat <<EOF\n$(rm x)\nEOF",
        "cat <<EOF\nnever ends",
    ],
)
def test_text_the_reader_cannot_follow_asks(command: str) -> None:
    """Attack: quoting, look-alike operators, expansions and compound syntax that a reader
    might take for something else. Each must make the command ask, never allow."""
    assert split_command(command) is None
    assert decide(command, ECHO_ALLOWED, rule("allow", ["rm", "cat", "diff", "read", "f", "a"])) == "ask"


def test_backticks_inside_double_quotes_unescape_the_quote() -> None:
    """Attack: `\\"` inside double-quoted backticks is a quote for the shell; a reader that
    keeps it as a literal would see a single-quoted string where the shell runs `rm`."""
    command = 'echo "`echo \\"\'\\" ; rm x ; echo \\"\'\\"`"'
    parts = split_command(command)
    assert parts is not None and "rm" in [p.program for p in parts]
    assert decide(command, ECHO_ALLOWED, RM_DENIED) == "deny"


def test_here_document_bodies_are_not_commands_and_quoted_ones_stay_data() -> None:
    parts = split_command("cat <<'EOF'\nrm -rf x\nEOF\nls")
    assert parts is not None
    assert [p.program for p in parts] == ["cat", "ls"]
    assert parts[0].redirects


# ---- assignments and wrappers ------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "GIT_CONFIG_PARAMETERS=\"'core.pager=sh -c id'\" git status",
        "LD_PRELOAD=/tmp/x.so ls",
        "PATH=/tmp/evil:$PATH ls",
        "PATH=/tmp/evil; ls",
        "env ls",
        "env -i PATH=/tmp/x ls",
        "command ls",
        "builtin echo x",
        "exec ls",
        "nice -n 5 ls",
        "timeout 5 ls",
        "nohup ls",
        "stdbuf -oL ls",
        "setsid ls",
        "xargs ls",
        "find . -exec rm {} ;",
        "sh -c ls",
        "bash -c 'echo x'",
    ],
)
def test_assignments_and_wrappers_ask(command: str) -> None:
    """Attack: a prefix (`NAME=value`, `env`, `timeout` ...) changes what an allowed
    program does, or runs another one."""
    assert decide(command, ECHO_ALLOWED) == "ask"


def test_a_rule_that_names_the_variable_decides() -> None:
    named = rule("allow", ["git status"], variables=["GIT_PAGER"])
    assert decide("GIT_PAGER=cat git status", named) == "allow"
    assert decide("GIT_PAGER=cat GIT_DIR=x git status", named) == "ask"


@pytest.mark.parametrize(
    "command",
    ["timeout 5 rm -rf x", "nice -n 1 rm x", "env A=1 rm x", "FOO=1 rm x", "sudo -u root rm x", "nohup rm x &"],
)
def test_a_deny_rule_sees_through_wrappers(command: str) -> None:
    assert decide(command, ECHO_ALLOWED, RM_DENIED) == "deny"


# ---- program names -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["/usr/bin/rm x", "/bin/rm x", "\\rm x", '"rm" x', "r''m x", "'r'm x", "r\\\nm x", "./rm x"]
)
def test_program_names_are_normalised_for_deny_rules(command: str) -> None:
    """Attack: spell `rm` so a rule for `rm` does not recognise it."""
    assert decide(command, RM_DENIED) == "deny"


@pytest.mark.parametrize("command", ["./ls", "/tmp/x/ls", "bin/ls -la", "~/ls", "../usr/bin/ls"])
def test_a_path_that_is_not_the_programs_never_matches_an_allow_rule(command: str) -> None:
    """Attack: an agent-written `./ls` in the workspace borrowing the allow rule for `ls`."""
    assert decide(command, ECHO_ALLOWED) == "ask"


def test_the_path_that_PATH_finds_matches_an_allow_rule() -> None:
    found = shutil.which("ls", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert found is not None
    assert decide(f"{found} -la", ECHO_ALLOWED) == "allow"


# ---- the differential oracle -------------------------------------------------------------

STUBS = ("alpha", "beta", "gamma", "rm")
FRAGMENTS = st.sampled_from(
    [
        "alpha", "beta", "gamma", "rm", "x", "-rf", "'a b'", '"q"', "A=1", "PATH=/nope", "#", "#'", '#"',
        "'", '"', "\\", "\\\n", ";", "&&", "||", "|", "&", "\n", "$(", ")", "(", "`", "<<EOF\n", "\nEOF\n",
        "<<'EOF'\n", "> out", "2>&1", "$'x'", "${A}", "$A", "{alpha,beta}", "r''m", "\\rm", '"alpha"',
        "bin/gamma", "#c", " ", "\t", "\\'", '\\"', "=", "$", "!", "{", "}", "*", "?", "x#y",
    ]
)  # fmt: skip
SEPARATORS = st.sampled_from(["", " ", " ", "\n"])
PROGRAMS = st.sampled_from(["alpha", "beta", "gamma", "rm", "r''m", "\\rm", '"alpha"', "bin/gamma", "A=1 alpha"])
ARGUMENTS = st.sampled_from(["x", "-rf", "'a b'", '"q"', "#", "#'", '#"', "x#y", "'#'", "\\#", "$A", "\\\n"])
OPERATORS = st.sampled_from([" ; ", " && ", " || ", " | ", " & ", "\n", ";", "&&"])


@st.composite
def simple_commands(draw: st.DrawFn) -> str:
    words = [draw(PROGRAMS), *draw(st.lists(ARGUMENTS, max_size=3))]
    text = " ".join(words)
    shape = draw(st.sampled_from(["{}", "{}", "$({})", "`{}`", "({})", 'echo "$({})"', 'echo "`{}`"', "{} > out"]))
    return shape.format(text)


@st.composite
def commands(draw: st.DrawFn) -> str:
    """Mostly well-formed lists of simple commands, with hazards spliced in."""
    if draw(st.booleans()):
        pieces = draw(st.lists(st.tuples(FRAGMENTS, SEPARATORS), min_size=1, max_size=12))
        return "".join(fragment + sep for fragment, sep in pieces)
    simple = draw(st.lists(simple_commands(), min_size=1, max_size=4))
    text = simple[0]
    for more in simple[1:]:
        text += draw(OPERATORS) + more
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(FRAGMENTS) + text[at:]
    return text


def _stub_sandbox(root: Path) -> dict[str, str]:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\nprintf "%s\\n" "${0##*/}" >> "$ORACLE_LOG"\n')
        stub.chmod(0o755)
    return {"PATH": str(bin_dir), "ORACLE_LOG": str(root / "ran.log")}


def _executed(shell: str, command: str, root: Path, env: dict[str, str]) -> list[str]:
    log = Path(env["ORACLE_LOG"])
    log.unlink(missing_ok=True)
    try:
        subprocess.run(
            [shell, "-c", command], cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        pass
    return log.read_text().split() if log.exists() else []


@pytest.mark.parametrize("shell", ["dash", "bash"])
def test_every_program_that_runs_was_judged(shell: str, tmp_path: Path) -> None:
    """Oracle: generated commands (operators, comments, quotes, assignments, newlines,
    here-docs, substitutions) run under a real shell whose every program is a logging stub.
    Whenever the reader splits a command without an opaque part, each program that ran
    must be one of its parts; whenever the policy allows it, only allowed programs ran."""
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed")
    env = _stub_sandbox(tmp_path)
    allow = rule("allow", ["alpha", "beta"])

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(commands())
    @example("alpha #'\nrm\n#'")
    @example("alpha`rm`")
    @example("alpha <<EOF\nrm\nEOF\nbeta")
    @example("A=1 alpha \\\nrm")
    @example('echo "$\\\n(rm)"')
    @example("alpha $\\\n(rm)")
    @example('alpha "`alpha \\"\'\\" ; rm ; alpha \\"\'\\"`"')
    def check(command: str) -> None:
        ran = _executed(path, command, tmp_path, env)
        parts = split_command(command)
        if parts is not None and not any(p.opaque for p in parts):
            judged = {p.program for p in parts}
            assert set(ran) <= judged, (command, ran, [p.words for p in parts])
        if decide(command, allow) == "allow":
            assert set(ran) <= {"alpha", "beta"}, (command, ran)

    check()
