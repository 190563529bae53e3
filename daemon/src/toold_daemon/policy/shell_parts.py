"""From the words of one simple command to a part the policy can judge.

The reader (``shell``) turns a command into simple commands, each a list of words with
what it learnt of them (quoted, an expansion, a glob); here each becomes a ``Part``:
assignments and wrappers taken off, the program it names, and why it is opaque when its
program is only known when it runs.
"""

from __future__ import annotations

import re

import msgspec

_RESERVED = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for", "in",
     "function", "select", "time", "coproc", "{", "}", "!", "[[", "]]"}
)  # fmt: skip
# Programs whose only job is to run another program given in their arguments.
_WRAPPERS = frozenset(
    {"env", "command", "builtin", "exec", "nice", "timeout", "nohup", "stdbuf", "setsid", "ionice", "time",
     "sudo", "doas", "chrt", "taskset", "unbuffer", "flock", "chroot", "su", "runuser", "setpriv", "unshare",
     "nsenter", "xargs", "watch", "strace", "ltrace", "firejail", "systemd-run", "busybox", "catchsegv"}
)  # fmt: skip
# Options of wrappers that take a separate value word.
_WRAPPER_VALUE_OPTIONS = {
    "env": {"-u", "--unset", "-C", "--chdir"},
    "exec": {"-a"},
    "nice": {"-n", "--adjustment"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "ionice": {"-c", "-n", "-p", "-t"},
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"},
    "doas": {"-u", "-C"},
    "stdbuf": {"-i", "-o", "-e"},
    "taskset": set(),
    "xargs": {"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"},
}
_WRAPPER_POSITIONALS = {"timeout": 1, "taskset": 1, "flock": 1, "chroot": 1, "chrt": 1}
# Programs that run code given as text, or change how later words of the script are read.
_CODE_RUNNERS = frozenset(
    {"eval", "source", ".", "trap", "fc", "alias", "unalias", "hash", "enable", "set", "shopt", "export",
     "declare", "typeset", "local", "readonly", "unset", "let", "read", "mapfile", "readarray", "getopts",
     "caller", "compgen", "complete", "bind"}
)  # fmt: skip
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "ash", "csh", "tcsh", "busybox"})
_FIND_RUNNERS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=")
SUBST = "\x00SUBST\x00"  # what a substitution leaves in a word (NUL never survives input checks)


class Unreadable(ValueError):
    """The command cannot be read with certainty."""


class Part(msgspec.Struct, frozen=True):
    """One simple command. ``words`` are after quote removal, assignments and wrappers
    dropped: ``words[0]`` is the program as typed (``/usr/bin/rm``), ``program`` its name."""

    words: tuple[str, ...]
    redirects: bool = False
    opaque: bool = False
    assignments: tuple[str, ...] = ()  # names assigned before the program
    wrappers: tuple[str, ...] = ()  # programs in front of the one this part names
    why_opaque: str = ""

    @property
    def program(self) -> str:
        """The program's name: directory, quotes and backslashes gone."""
        return self.words[0].rsplit("/", 1)[-1] if self.words else ""

    @property
    def explicit_path(self) -> str | None:
        """The command word when it names a file (has a ``/``), else None."""
        return self.words[0] if self.words and "/" in self.words[0] else None

    @property
    def text(self) -> str:
        """The command as rules see it: program name normalised, then its arguments."""
        return " ".join([self.program, *self.words[1:]]).replace(SUBST, "$(…)")

    @property
    def plain(self) -> bool:
        """Nothing about this part that a rule for its program could not vouch for."""
        return not (self.redirects or self.opaque or self.assignments or self.wrappers) and bool(self.words)


class Word(msgspec.Struct):
    text: list[str] = msgspec.field(default_factory=list)  # after quote removal
    raw: list[str] = msgspec.field(default_factory=list)  # unquoted characters as typed ("" for quoted ones)
    quoted: bool = False
    dynamic: bool = False  # an expansion: its value is only known when it runs
    glob: bool = False

    @property
    def value(self) -> str:
        return "".join(self.text)

    @property
    def unquoted(self) -> str:
        return "".join(self.raw)


class Simple(msgspec.Struct):
    words: list[Word] = msgspec.field(default_factory=list)
    redirects: bool = False


def part_of(simple: Simple) -> Part:
    words = list(simple.words)
    assignments: list[str] = []
    while words and (match := ASSIGNMENT.match(words[0].unquoted)) is not None:
        if "[" in words[0].unquoted.split("=", 1)[0]:
            raise Unreadable("an array assignment")
        assignments.append(match.group(1))
        words.pop(0)
    if not words:
        return Part((), simple.redirects, opaque=True, assignments=tuple(assignments), why_opaque="no program")
    first = words[0]
    if not first.quoted and first.value in _RESERVED:
        raise Unreadable(f"the compound command {first.value!r}")
    values = [w.value for w in words]
    for word in simple.words:
        if "[" in word.value and (word.dynamic or "$" in word.value or "`" in word.value):
            raise Unreadable("a word the shell may evaluate as arithmetic")
    wrappers: list[str] = []
    why = _why_opaque(words[0], values)
    while not why and _program_name(values[0]) in _WRAPPERS:
        wrapper = _program_name(values[0])
        wrappers.append(wrapper)
        inner = _unwrap(wrapper, values)
        if inner is None:
            why = f"{wrapper} runs a program this reader cannot find in its arguments"
            break
        words, values = words[inner:], values[inner:]
        why = _why_opaque(words[0], values)
    return Part(
        tuple(values),
        simple.redirects,
        opaque=bool(why),
        assignments=tuple(assignments),
        wrappers=tuple(wrappers),
        why_opaque=why,
    )


def _program_name(value: str) -> str:
    return value.rsplit("/", 1)[-1]


def _why_opaque(first: Word, values: list[str]) -> str:
    """Why the program of these words is not known before it runs ("" when it is)."""
    if first.dynamic or first.glob or SUBST in first.value:
        return "its program comes from an expansion"
    if first.unquoted.startswith("~"):
        return "its program path starts with ~"
    name = _program_name(values[0])
    if not name:
        return "an empty program name"
    if name in _CODE_RUNNERS:
        return f"{name} runs code given as text or changes how later commands are read"
    if name in _SHELLS and len(values) > 1:
        return f"{name} runs a script"
    if name == "find" and any(v in _FIND_RUNNERS for v in values[1:]):
        return "find -exec runs other programs"
    if name == "printf" and "-v" in values[1:]:
        return "printf -v assigns a variable"
    if name in ("test", "[") and any(v in ("-v", "-R") for v in values[1:]):
        return "test -v evaluates a variable name"
    return ""


def _unwrap(wrapper: str, values: list[str]) -> int | None:
    """Index of the wrapped program's word in ``values`` (``values[0]`` is the wrapper)."""
    value_options = _WRAPPER_VALUE_OPTIONS.get(wrapper, set())
    positionals = _WRAPPER_POSITIONALS.get(wrapper, 0)
    i = 1
    while i < len(values):
        value = values[i]
        if value == "--":
            i += 1
            continue
        if value.startswith("-") and len(value) > 1:
            if wrapper == "env" and (value in ("-S", "--split-string") or value.startswith("-S")):
                return None  # env -S splits a string into a command: unreadable
            i += 2 if value in value_options else 1
            continue
        if wrapper == "env" and ASSIGNMENT.match(value):
            i += 1
            continue
        if positionals:
            positionals -= 1
            i += 1
            continue
        return i
    return None


def matches_prefix(part: Part, prefix: str) -> bool:
    """Does ``part`` start with the words of ``prefix``? (``git`` matches ``git log``, not ``gitx``.)
    The program is compared by name: ``/usr/bin/git log`` starts with ``git``."""
    wanted = prefix.split()
    words = [part.program, *part.words[1:]]
    return bool(wanted) and words[: len(wanted)] == wanted
