"""Class S: a rule allowing a program allows its harmless use, not options that make it
run another program, write or delete a file, or load code.

An administrator who allows ``ls``, ``cat``, ``grep``, ``find``, ``sort``, ``git log`` …
Each dangerous option of the table (``policy/options.py``) asks; the same command without
it is still allowed; a rule naming the option allows it. Cases written from the programs'
manuals and from the kinds of commands other agents' shell policies refuse.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, start_daemon
from toold_daemon.config import ApprovalConfig, Condition, Rule
from toold_daemon.policy import Facts, evaluate, split_command
from toold_daemon.policy.options import HAZARDOUS_OPTIONS, hazards
from toold_protocol import Identity

ME = Identity(uid=os.getuid(), gid=os.getgid(), pid=1)
ALLOWED_PROGRAMS = [
    "ls", "cat", "grep", "find", "sort", "git log", "git diff", "git show", "git status", "git grep", "git fetch",
    "git clone", "git push", "git archive", "git format-patch", "git rebase", "git submodule", "git bisect", "git",
    "rg", "sed", "awk", "gawk", "tar", "zip", "unzip", "less", "man", "ssh", "scp", "rsync", "curl", "wget",
    "base64", "tee", "uniq", "yq", "perl", "python3", "python", "node", "ruby", "php", "xxd", "echo", "head",
    "git ls-remote", "git pull", "git difftool", "git mergetool", "git blame", "sftp", "jq", "lua", "Rscript",
    "deno", "diff", "date", "patch",
]  # fmt: skip


def decide(command: str, prefixes: list[str] = ALLOWED_PROGRAMS) -> tuple[str, str]:
    rules = [
        Rule(decision="allow", tool="shell", conditions=[Condition(param="command", operator="prefix", value=prefixes)])
    ]
    facts = Facts(tool="shell", arguments={"command": command}, side_effecting=True, risk="high")
    verdict = evaluate(facts, ME, "", ApprovalConfig(mode="prompt", rules=rules))
    return verdict.decision, verdict.reason


ASKED = [
    # find: only -exec and friends asked before
    "find . -delete", "find . -name '*.o' -delete", "find . -fprint /tmp/out", "find . -fprint0 out",
    "find . -fprintf out '%p'", "find . -fls out", "find . -execdir rm {} +", "find . -okdir rm {} ;",
    # sort: the worst of them runs any command
    "sort --compress-program=sh x", "sort --compress-program sh x", "sort --compress-prog=sh x",
    "sort -o out.txt in.txt", "sort -uo out.txt in.txt", "sort --output=out in", "sort --files0-from=list",
    # git: global options and the subcommands' own
    "git -c core.pager=id log", "git -c core.fsmonitor=id status", "git --exec-path=/tmp/x log",
    "git --git-dir=/tmp/evil/.git status", "git --work-tree=/tmp log", "git --config-env=core.pager=X log",
    "git log --output=/tmp/x", "git diff --output x", "git show --output=x HEAD", "git log --ext-diff",
    "git diff --textconv", "git grep -O id pattern", "git grep --open-files-in-pager=id x",
    "git archive --remote=x --exec=id HEAD", "git archive -o out.tar HEAD", "git fetch --upload-pack=id origin",
    "git clone --upload-pack=id x y", "git clone -u id x", "git clone --template=/tmp/t x",
    "git push --receive-pack=id origin", "git format-patch -o /tmp/p HEAD~1", "git rebase --exec id HEAD~2",
    "git rebase -x id HEAD~2", "git submodule foreach id", "git bisect run ./x.sh",
    # ripgrep
    "rg --pre ./x pattern", "rg --pre=cat pattern", "rg --hostname-bin=./x pattern", "rg -z pattern",
    "rg --search-zip pattern", "rg -nz pattern",
    # sed: in place, script commands and flags
    "sed -i s/a/b/ f", "sed --in-place=.bak s/a/b/ f", "sed -n 1e\\ id f", "sed 'e id' f", "sed 's/x/id/e' f",
    "sed 's/a/b/w /tmp/out' f", "sed -e 'w out' f", "sed '1,3w out' f", "sed '/x/W out' f", "sed -f script.sed f",
    "sed -ne 's|a|b|e' f",
    # awk programs
    "awk 'BEGIN{system(\"id\")}'", "awk '{print | \"sh\"}' f", "awk '{print > \"out\"}' f",
    "awk '\"id\" | getline x' f", "gawk -l filefuncs 'BEGIN{}'", "awk -f prog.awk f", "awk -v x=1 '{system(x)}' f",
    # tar
    "tar --to-command=id -xf a.tar", "tar -I id -cf a.tar .", "tar --use-compress-program=id -cf a.tar .",
    "tar --checkpoint=1 --checkpoint-action=exec=id -cf a.tar .", "tar xf a.tar", "tar -xzf a.tar.gz",
    "tar -czf out.tgz .", "tar -F id -cf a.tar .",
    # zip/unzip
    "zip -T -TT id a.zip x", "zip --unzip-command=id -T a.zip x", "unzip a.zip", "unzip -o a.zip",
    "unzip -d /tmp a.zip",
    # pagers and man
    "less -o /tmp/log x", "less --log-file=/tmp/log x", "man -P id ls", "man --pager=id ls", "man -H id ls",
    # ssh/scp/rsync
    "ssh -o ProxyCommand=id host", "ssh -oLocalCommand=id host", "scp -o ProxyCommand=id a host:b",
    "scp -S ./x a host:b", "rsync -e 'sh -c id' a b", "rsync --rsync-path=id a host:b", "rsync --delete a/ b/",
    # curl/wget output and configuration
    "curl -o /tmp/x https://example.com", "curl -O https://example.com/x", "curl -K cfg https://e.com",
    "curl --output=x https://e.com", "curl -sSLo x https://e.com", "curl -D headers https://e.com",
    "curl -c jar https://e.com", "wget -O x https://e.com", "wget -e use_proxy=on https://e.com",
    "wget --use-askpass=./x https://e.com", "wget -P /tmp https://e.com",
    # base64, tee, uniq, yq, xxd
    "base64 -o out in", "tee out.txt", "uniq in out", "yq -i .a=1 f.yaml", "xxd -r hex bin",
    # interpreters' code options
    "python3 -c 'import os'", "python -m http.server", "perl -e 'system q(id)'", "perl -i -pe s/a/b/ f",
    "node -e 'require(\"child_process\")'", "node --eval=1", "ruby -e 'x'", "php -r 'x'",
    # the rest of the table
    "git ls-remote --upload-pack=id origin", "git pull --upload-pack=id", "git difftool -x id",
    "git mergetool --tool=id", "git blame --contents=/tmp/x f", "sftp -o ProxyCommand=id host", "jq -L /tmp/m .",
    "lua -e 'os.execute(1)'", "Rscript -e 'system(1)'", "deno eval 'x'", "diff --to-file=/tmp/x a",
    "date -s 2020-01-01", "patch -o out f",
]  # fmt: skip


@pytest.mark.parametrize("command", ASKED)
def test_a_dangerous_option_of_an_allowed_program_asks(command: str) -> None:
    decision, reason = decide(command)
    assert decision == "ask", (command, reason)


ALLOWED = [
    "ls -la", "find . -name '*.py' -print", "find . -type f -newer x", "sort -n -k2 x", "sort -u x",
    "git log --oneline -5", "git log --stat", "git -C sub log", "git diff HEAD~1", "git show HEAD:x",
    "git status --short", "git grep -n pattern", "rg -n pattern", "rg -i --glob '*.py' x", "sed -n 1,5p f",
    "sed 's/hello/world/g' f", "sed -e 's/a/b/' -e 's/c/d/' f", "awk '{print $1}' f", "awk -F: '$3 > 5 {print}' f",
    "tar -tzf a.tar.gz", "tar tf a.tar", "unzip -l a.zip", "less x", "man ls", "curl -sSL https://e.com",
    "curl -s https://e.com", "wget -q -O - https://e.com", "base64 f", "uniq f", "yq .a f.yaml", "echo hi",
    "cat f", "grep -rn x .", "head -5 f", "python3 script.py", "git fetch origin",
]  # fmt: skip


@pytest.mark.parametrize("command", ALLOWED)
def test_the_same_programs_harmless_use_is_still_allowed(command: str) -> None:
    decision, reason = decide(command)
    assert decision == "allow", (command, reason)


def test_every_program_of_the_table_has_a_case() -> None:
    """Each entry of the table is exercised by at least one asked command above."""
    programs = {
        key.split()[0] if not key.startswith("git ") else key for key in HAZARDOUS_OPTIONS if HAZARDOUS_OPTIONS[key]
    }
    covered = {key for key in programs if any(c.startswith(key) or c.split()[0].startswith(key) for c in ASKED)}
    missing = sorted(programs - covered)
    assert not missing, missing


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("sort -o out.txt in.txt", "sort -o"),
        ("find build -delete", "find build -delete"),
        ("git log --output changes.txt", "git log --output"),
        ("sed -i s/a/b/ f", "sed -i"),
    ],
)
def test_a_rule_that_names_the_option_allows_it(command: str, rule: str) -> None:
    assert decide(command, [rule])[0] == "allow"


def test_a_rule_for_one_option_does_not_allow_another() -> None:
    assert decide("sort -o out --compress-program=sh in", ["sort -o"])[0] == "ask"


def test_hazards_name_what_they_do() -> None:
    assert [h.describe("sort") for h in hazards(["sort", "--compress-program=sh"])] == [
        "sort --compress-program runs a program"
    ]
    assert hazards(["find", ".", "-name", "-delete-me"]) == []


@pytest.mark.parametrize(
    "command",
    [
        "cd '$(touch PWNED)' && echo ${PWD@P}", "echo ${!prefix}", "echo ${x@E}", "echo ${x@Q}", "echo ${x/a/b}",
        "echo ${x^^}", "echo ${x:1:2}", "echo ${!x@}",
        "ls &&", "ls |", "ls ||", "&& ls", "ls; ; ls", "echo $(ls |)",
    ],
)  # fmt: skip
def test_bash_only_expansions_and_invalid_shell_are_not_read_as_allowed(command: str) -> None:
    """Attack: under bash, ``${PWD@P}`` expands prompt escapes, so a directory named
    ``$(touch PWNED)`` runs; an invalid command is no command any rule allowed."""
    assert split_command(command) is None
    assert decide(command)[0] == "ask"


def test_bash_really_runs_what_a_prompt_expansion_names(tmp_path: Path) -> None:
    """The attack is real: the command above runs ``touch`` under bash."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    (tmp_path / "$(touch PWNED)").mkdir()
    subprocess.run(
        ["bash", "-c", "cd '$(touch PWNED)' && echo ${PWD@P}"], cwd=tmp_path, check=True, capture_output=True
    )
    assert (tmp_path / "$(touch PWNED)" / "PWNED").exists() or (tmp_path / "PWNED").exists()


@pytest.fixture
def explained_daemon(tmp_path: Path, root: Path) -> DaemonProcess:
    config = """
[[tools.approval.rules]]
tool = "shell"
decision = "allow"
conditions = [{ param = "command", operator = "prefix", value = ["sort", "find", "git log"] }]
"""
    return start_daemon(tmp_path, root, config=config)


def test_policy_explain_names_the_option(explained_daemon: DaemonProcess) -> None:
    try:
        with explained_daemon.client(timeout=10) as c:
            asked = c.explain("shell", {"command": "sort --compress-program=sh data.txt"})
            allowed = c.explain("shell", {"command": "sort data.txt"})
    finally:
        explained_daemon.stop()
    assert asked.decision == "ask" and "--compress-program runs a program" in asked.reason
    assert allowed.decision == "allow"
