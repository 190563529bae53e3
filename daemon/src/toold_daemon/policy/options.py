"""Options that make an allowed program run another program, write or delete a file, or
load code: one table, in data.

A rule allowing ``sort`` or ``git log`` is read as allowing what the program does with
harmless arguments. Some options turn such a program into something else entirely:
``sort --compress-program=sh`` runs any command, ``git log --output=FILE`` writes one,
``find -delete`` deletes, ``rg --pre CMD`` runs a preprocessor. Where one of these appears,
the command asks unless the deciding rule names that option (its condition's words
include it: a rule for ``sort -o`` allows ``sort -o out.txt``).

Matching is deliberately generous (asking more, never less):

- a long option matches when its name is spelled out or abbreviated (GNU getopt takes any
  unambiguous prefix: ``--compress-prog=sh`` is ``--compress-program``), with or without
  ``=value``;
- a short option matches anywhere in a cluster (``-nuo FILE`` has ``-o``);
- ``find``'s primaries and ``tar``'s old-style first word (``xf``) are matched as written;
- ``sed`` scripts are read for their ``e``, ``w`` and ``W`` commands and ``s///e`` /
  ``s///w`` flags, and ``awk`` programs for ``system``, pipes, output redirection and
  ``getline`` from a command;
- ``git``'s global options (``-c``, ``--exec-path``, …) are checked before its
  subcommand, and the subcommand's own options under ``git SUBCOMMAND``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Literal

import msgspec

Effect = Literal["runs a program", "writes a file", "deletes files", "loads code", "reads its script from a file"]
RUNS: Effect = "runs a program"
WRITES: Effect = "writes a file"
DELETES: Effect = "deletes files"
LOADS: Effect = "loads code"
HIDDEN: Effect = "reads its script from a file"

#: program (or "git SUBCOMMAND") -> option -> what it does. Options are spelt as typed:
#: ``-o`` short, ``--output`` long, ``-delete`` a find primary.
HAZARDOUS_OPTIONS: dict[str, dict[str, Effect]] = {
    "find": {
        "-exec": RUNS, "-execdir": RUNS, "-ok": RUNS, "-okdir": RUNS, "-delete": DELETES,
        "-fprint": WRITES, "-fprint0": WRITES, "-fprintf": WRITES, "-fls": WRITES,
    },
    "sort": {"--compress-program": RUNS, "-o": WRITES, "--output": WRITES, "--files0-from": HIDDEN},
    "git": {
        "-c": LOADS, "--config-env": LOADS, "--exec-path": RUNS, "--git-dir": LOADS, "--work-tree": LOADS,
        "--namespace": LOADS, "--super-prefix": LOADS,
    },
    "git log": {"--output": WRITES, "--ext-diff": RUNS, "--textconv": RUNS},
    "git diff": {"--output": WRITES, "--ext-diff": RUNS, "--textconv": RUNS},
    "git show": {"--output": WRITES, "--ext-diff": RUNS, "--textconv": RUNS},
    "git format-patch": {"--output": WRITES, "-o": WRITES, "--output-directory": WRITES},
    "git grep": {"-O": RUNS, "--open-files-in-pager": RUNS, "--textconv": RUNS},
    "git archive": {"-o": WRITES, "--output": WRITES, "--exec": RUNS, "--remote": RUNS},
    "git fetch": {"--upload-pack": RUNS},
    "git pull": {"--upload-pack": RUNS},
    "git clone": {"--upload-pack": RUNS, "-u": RUNS, "--template": LOADS, "-c": LOADS, "--config": LOADS},
    "git ls-remote": {"--upload-pack": RUNS},
    "git push": {"--receive-pack": RUNS, "--exec": RUNS},
    "git rebase": {"--exec": RUNS, "-x": RUNS},
    "git difftool": {"--extcmd": RUNS, "-x": RUNS, "--tool": RUNS, "-t": RUNS},
    "git mergetool": {"--tool": RUNS, "-t": RUNS},
    "git submodule": {"foreach": RUNS},
    "git bisect": {"run": RUNS},
    "git blame": {"--contents": HIDDEN},
    "rg": {"--pre": RUNS, "--hostname-bin": RUNS, "-z": RUNS, "--search-zip": RUNS},
    "sed": {"-i": WRITES, "--in-place": WRITES, "-f": HIDDEN, "--file": HIDDEN},
    "awk": {"-f": HIDDEN, "--file": HIDDEN, "-i": LOADS, "--include": LOADS, "-l": LOADS, "--load": LOADS,
            "-E": HIDDEN, "--exec": HIDDEN},
    "tar": {
        "--to-command": RUNS, "-I": RUNS, "--use-compress-program": RUNS, "--checkpoint-action": RUNS,
        "-F": RUNS, "--info-script": RUNS, "--new-volume-script": RUNS, "--rsh-command": RUNS,
        "-x": WRITES, "--extract": WRITES, "--get": WRITES, "-c": WRITES, "--create": WRITES, "-r": WRITES,
        "--append": WRITES, "-u": WRITES, "--update": WRITES, "--delete": DELETES, "-A": WRITES,
        "--catenate": WRITES, "--remove-files": DELETES,
    },
    "zip": {"-T": RUNS, "--test": RUNS, "-TT": RUNS, "--unzip-command": RUNS, "-m": DELETES, "--move": DELETES},
    "unzip": {"-o": WRITES, "-d": WRITES},
    "less": {"-o": WRITES, "-O": WRITES, "--log-file": WRITES, "--LOG-FILE": WRITES, "-k": LOADS,
             "--lesskey-file": LOADS, "--lesskey-src": LOADS},
    "more": {},
    "man": {"-P": RUNS, "--pager": RUNS, "-H": RUNS, "--html": RUNS, "-p": RUNS, "--preprocessor": RUNS,
            "-l": LOADS, "--local-file": LOADS, "-C": LOADS, "--config-file": LOADS},
    "ssh": {"-o": RUNS, "-F": LOADS, "-S": RUNS, "-E": WRITES},
    "scp": {"-o": RUNS, "-F": LOADS, "-S": RUNS},
    "sftp": {"-o": RUNS, "-F": LOADS, "-S": RUNS, "-D": RUNS, "-b": HIDDEN},
    "rsync": {"-e": RUNS, "--rsh": RUNS, "--rsync-path": RUNS, "--remove-source-files": DELETES,
              "--delete": DELETES, "--log-file": WRITES, "--write-batch": WRITES, "--only-write-batch": WRITES},
    "curl": {
        "-o": WRITES, "--output": WRITES, "-O": WRITES, "--remote-name": WRITES, "--remote-name-all": WRITES,
        "--output-dir": WRITES, "-K": LOADS, "--config": LOADS, "-D": WRITES, "--dump-header": WRITES,
        "-c": WRITES, "--cookie-jar": WRITES, "--trace": WRITES, "--trace-ascii": WRITES, "--libcurl": WRITES,
        "--etag-save": WRITES, "--hsts": WRITES, "--alt-svc": WRITES, "--stderr": WRITES,
    },
    "wget": {
        "-O": WRITES, "--output-document": WRITES, "-o": WRITES, "--output-file": WRITES, "-a": WRITES,
        "--append-output": WRITES, "-P": WRITES, "--directory-prefix": WRITES, "-e": LOADS, "--execute": LOADS,
        "--config": LOADS, "--use-askpass": RUNS, "-i": HIDDEN, "--input-file": HIDDEN,
    },
    "base64": {"-o": WRITES, "--output": WRITES},
    "xxd": {"-r": WRITES},
    "tee": {},
    "uniq": {},
    "yq": {"-i": WRITES, "--inplace": WRITES},
    "jq": {"-L": LOADS},
    "perl": {"-e": RUNS, "-E": RUNS, "-i": WRITES, "-M": LOADS, "-m": LOADS, "-I": LOADS, "-x": RUNS},
    "python": {"-c": RUNS, "-m": RUNS},
    "ruby": {"-e": RUNS, "-r": LOADS, "-I": LOADS, "-i": WRITES},
    "node": {"-e": RUNS, "--eval": RUNS, "-p": RUNS, "--print": RUNS, "-r": LOADS, "--require": LOADS,
             "--import": LOADS, "--loader": LOADS, "--experimental-loader": LOADS},
    "php": {"-r": RUNS, "-B": RUNS, "-R": RUNS, "-E": RUNS, "-F": RUNS, "-d": LOADS},
    "lua": {"-e": RUNS, "-l": LOADS},
    "Rscript": {"-e": RUNS},
    "deno": {"eval": RUNS},
    "diff": {"--to-file": HIDDEN},
    "date": {"-s": WRITES, "--set": WRITES},
    "patch": {"-o": WRITES, "--output": WRITES},
    "split": {},
}  # fmt: skip

# Other names for the same program.
_ALIASES = {"gawk": "awk", "mawk": "awk", "nawk": "awk", "busybox awk": "awk", "gsed": "sed", "gtar": "tar",
            "bsdtar": "tar", "python3": "python", "pypy": "python", "pypy3": "python", "nodejs": "node",
            "ripgrep": "rg", "zipnote": "zip", "zipsplit": "zip"}  # fmt: skip
_PYTHON_VERSIONED = re.compile(r"^python3\.\d+$")
# Programs whose every positional argument (``tee``), or a given one (``uniq`` IN OUT), is written.
_WRITES_POSITIONAL: dict[str, int] = {"tee": 1, "uniq": 2, "split": 1}
# Options that take their value as the next word, so that word is not read as an option.
_VALUE_OPTIONS = {"git": {"-c", "-C", "--exec-path", "--git-dir", "--work-tree", "--namespace", "--config-env"}}


class Hazard(msgspec.Struct, frozen=True):
    option: str  # as the table spells it (``--compress-program``), or what was found (``e`` in a sed script)
    effect: Effect

    def describe(self, program: str) -> str:
        return f"{program} {self.option} {self.effect}"


def hazards(words: Sequence[str]) -> list[Hazard]:
    """What in ``words`` (a simple command: program, then arguments, wrappers and
    assignments already taken off) runs, writes, deletes or loads beyond the program's
    harmless use."""
    if not words:
        return []
    program = _canonical_program(words[0])
    args = list(words[1:])
    if program == "git":
        return list(_git_hazards(args))
    found = list(_option_hazards(program, args))
    if program == "sed":
        found += _sed_hazards(args)
    elif program == "awk":
        found += _awk_hazards(args)
    elif program == "tar" and args and not args[0].startswith("-"):
        found += list(_option_hazards("tar", ["-" + args[0], *args[1:]]))
    if program == "unzip" and not any(_lists_only(a) for a in args):
        found.append(Hazard("(extracting)", WRITES))
    position = _WRITES_POSITIONAL.get(program)
    if position is not None:
        positionals = [a for a in args if not a.startswith("-") or a == "-"]
        if len(positionals) >= position and positionals[position - 1] != "-":
            found.append(Hazard(f"{positionals[position - 1]!r} (an output file)", WRITES))
    return found


def _lists_only(arg: str) -> bool:
    """unzip's options that list, test or print instead of extracting."""
    return arg.startswith("-") and not arg.startswith("--") and bool(set(arg[1:]) & set("ltvpZz"))


def _canonical_program(word: str) -> str:
    name = word.rsplit("/", 1)[-1]
    if _PYTHON_VERSIONED.match(name):
        return "python"
    return _ALIASES.get(name, name)


def _option_hazards(table: str, args: Sequence[str]) -> Iterator[Hazard]:
    options = HAZARDOUS_OPTIONS.get(table, {})
    if not options:
        return
    exact = table == "find" or table in ("deno", "git submodule", "git bisect")
    for i, arg in enumerate(args):
        if arg == "--" and not exact:
            return
        if exact:
            if arg in options:
                yield Hazard(arg, options[arg])
            continue
        to_stdout = arg.endswith(("=-", "O-", "o-")) or args[i + 1 : i + 2] == ["-"]
        yield from (h for h in _matches(arg, options) if not (to_stdout and h.effect == WRITES))


def _matches(arg: str, options: dict[str, Effect]) -> Iterator[Hazard]:
    if arg.startswith("--") and len(arg) > 2:
        name = arg.split("=", 1)[0]
        for option, effect in options.items():
            if option.startswith("--") and len(name) >= 4 and option.startswith(name):
                yield Hazard(option, effect)
    elif arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        if arg in options:  # a single-dash long option (-TT, -fprint)
            yield Hazard(arg, options[arg])
            return
        letters = arg[1:]
        for option, effect in options.items():
            if len(option) == 2 and option[0] == "-" and option[1] in letters:
                yield Hazard(option, effect)


def _git_hazards(args: list[str]) -> Iterator[Hazard]:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        yield from _matches(args[i], HAZARDOUS_OPTIONS["git"])
        takes_value = args[i] in _VALUE_OPTIONS["git"]
        i += 2 if takes_value else 1
    if i >= len(args):
        return
    subcommand = args[i]
    yield from _option_hazards(f"git {subcommand}", args[i + 1 :])


# ---- scripts given as text ------------------------------------------------------------------

# Linear whatever the script: in a regex between delimiters a backslash always escapes the
# next character, and the runs are possessive (``*+``). Letting a backslash also stand for
# itself made each run of them match in 2^n ways: 40 backslashes held the daemon for hours.
_SED_ADDRESS = re.compile(
    r"^\s*+(?:\d++|\$|/(?:[^/\\]|\\.)*+/|\\(.)(?:\\.|(?!\1)[^\\])*+\1)?"
    r"(?:\s*+,\s*+(?:\d++|\$|/(?:[^/\\]|\\.)*+/))?\s*+!?\s*+"
)


def _sed_hazards(args: list[str]) -> list[Hazard]:
    """``e`` (run), ``w``/``W`` (write) commands and ``s///e`` / ``s///w`` flags in the
    scripts of ``-e``/``--expression`` or the first operand. ``--sandbox`` refuses them
    in sed itself, so a command carrying it has none of these."""
    if "--sandbox" in args:
        return []
    scripts: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--expression="):
            scripts.append(arg.split("=", 1)[1])
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            scripts.append(arg[2:])
        i += 1
    if not scripts:
        operands = [a for a in args if not a.startswith("-")]
        if operands and not any(a in ("-f", "--file") or a.startswith("--file=") for a in args):
            scripts.append(operands[0])
    found: list[Hazard] = []
    for script in scripts:
        found += _sed_script_hazards(script)
    return found


def _sed_script_hazards(script: str) -> list[Hazard]:
    found: list[Hazard] = []
    for command in re.split(r"[;\n]", script):
        rest = _SED_ADDRESS.sub("", command, count=1).lstrip("{ ")
        if not rest:
            continue
        head = rest[0]
        if head == "e":
            found.append(Hazard("e (a sed command)", RUNS))
        elif head in "wW":
            found.append(Hazard(f"{head} (a sed command)", WRITES))
        elif head == "s" and len(rest) > 1:
            flags = _substitution_flags(rest)
            if "e" in flags:
                found.append(Hazard("s///e (a sed flag)", RUNS))
            if "w" in flags:
                found.append(Hazard("s///w (a sed flag)", WRITES))
    return found


def _substitution_flags(command: str) -> str:
    """The flags after ``s/pattern/replacement/`` (any delimiter, escapes followed)."""
    delimiter = command[1]
    seen = 0
    i = 2
    while i < len(command):
        ch = command[i]
        if ch == "\\":
            i += 2
            continue
        if ch == delimiter:
            seen += 1
            if seen == 2:
                return command[i + 1 :].split("}", maxsplit=1)[0]
        i += 1
    return ""


# Possessive runs of blanks (``\s*+``): two runs that may trade blanks (``\s*&?\s*``)
# took time quadratic in them, seconds for a program of 64 KB of blanks.
_AWK_HAZARDS = re.compile(
    r"\bsystem\s*+\(|\|\s*+&?\s*+getline|\|\s*+\"|\|\s*+[A-Za-z_]|>\s*+\"|>\s*+[A-Za-z_$(]|\bfflush\b|@load|@include"
)


def _awk_hazards(args: list[str]) -> list[Hazard]:
    """An awk program that calls ``system``, pipes to or from a command, or prints to a file."""
    program = ""
    # ``-v name=value`` and ``-F sep`` take the next word: the program is after them
    i = 0
    while i < len(args):
        if args[i] in ("-v", "-F", "--assign", "--field-separator"):
            i += 2
            continue
        if not args[i].startswith("-"):
            program = args[i]
            break
        i += 1
    if _AWK_HAZARDS.search(program):
        return [Hazard("program (system, a pipe or output to a file)", RUNS)]
    return []


def rule_names_option(rule_words: Sequence[str], hazard: Hazard) -> bool:
    """Whether a rule's condition words name this option (``sort -o`` names ``-o``)."""
    option = hazard.option.split(" ", 1)[0]
    return any(word == option or word.startswith(option + "=") for word in rule_words)
