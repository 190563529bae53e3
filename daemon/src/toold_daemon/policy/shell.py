"""Reading a shell command the way the shell will, so that every simple command it runs
can be judged.

``split_command("git status && curl x | sh")`` → parts for ``git status``, ``curl x`` and
``sh``. The reader is a small POSIX lexer, not a general parser: it follows quoting,
backslashes, line continuations, comments (``#`` only where a word starts), here-doc
bodies, ``$(…)``/backtick substitutions and ``( … )`` subshells (their commands become
parts of their own), and flags what a rule alone cannot vouch for:

- ``redirects``: ``>``, ``<``, here-docs, ``2>&1``… (``echo x > ~/.bashrc`` is not ``echo``);
- ``assignments``: ``NAME=value prog`` can change what ``prog`` does (``LD_PRELOAD``,
  ``PATH``, ``GIT_CONFIG_PARAMETERS``);
- ``wrappers``: ``env``, ``nice``, ``timeout``, ``exec``… run another program; the part
  names that program (so a deny rule for ``rm`` sees ``timeout 5 rm``);
- ``opaque``: the program is only known when it runs (``eval``, ``$CMD``, ``sh -c``,
  ``find -exec``, a glob in the command word, shell builtins that change what later
  words mean);
- ``explicit_path``: the command word had a ``/`` (``/usr/bin/rm``, ``./rm``).

Program names are normalised (quotes and backslashes removed, directory dropped), so
``/usr/bin/rm``, ``\\rm``, ``"rm"`` and ``r''m`` are all ``rm``.

Whatever this reader cannot follow with certainty makes ``split_command`` return None:
``$'…'``/``$"…"`` quoting, unbalanced quotes or parentheses, brace expansion, arithmetic,
compound commands (``if``, ``for``, ``{ …; }``, ``[[``), process substitution, control
characters, and unicode look-alikes of shell operators. The caller must then ask.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from .shell_parts import SUBST, Part, Simple, Unreadable, Word, part_of

MAX_COMMAND_CHARS = 64 * 1024
_MAX_DEPTH = 32  # nested substitutions
#: Words, subshells and substitutions one command may hold. Reading runs on the event
#: loop, so its cost must not grow with what a client sends: past this the command is
#: unreadable, and asked about (as the denied-file check asks past 512 words).
MAX_WORDS = 512
#: Characters read one at a time (escapes, expansions, quotes, operators; runs of plain
#: text are matched whole): bounded for the same reason.
MAX_STEPS = 8192

_META = frozenset(" \t\n;&|<>()")
_OPERATOR_CHARS = frozenset(";&|<>()$`'\"\\#\n{}*?[]~!=")
# ${name}, ${#name} and the POSIX operators (:- - := = :? ? :+ + # ## % %%) on a name,
# a positional or a special parameter; nothing else.
_POSIX_EXPANSION = re.compile(
    r"^(?:#?(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-]))(?:(?::?[-=?+]|##?|%%?).*)?$", re.DOTALL
)
# Characters read_word takes as they are (no quoting, expansion, glob or operator; ASCII),
# and those a double-quoted string takes as they are: matched as runs, not one by one.
# (Written as the ASCII they are: a class reaching U+10FFFF costs milliseconds to compile,
# which every start of the daemon would pay.)
_PLAIN_RUN = re.compile(r"[\x21\x23\x25\x2a-\x3a\x3d\x3f-\x5b\x5d-\x5f\x61-\x7b\x7d\x7e]+")
_GLOB = re.compile(r"[*?\[]")
_BACKTICK_RUN = re.compile(r"[^`\\]+")
_WIDE_RUN = re.compile(r"[^\x00-\x7f]+")
_QUOTED_RUN = re.compile(r'[^"\\$`]+')
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
_DOLLAR_NAME = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])")
# Control characters (tab and newline aside), and what lies outside ASCII (each distinct
# one looked at).
# A brace's body (no brace inside), possessive: one regex with a run on each side of the
# comma (``\{[^{}]*(,|\.\.)[^{}]*\}``) took time quadratic in the word: 17 s for a
# 60 KB word of commas, on the daemon's event loop.
_BRACE_BODY = re.compile(r"\{([^{}]*+)\}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_OPERATOR = re.compile("[" + re.escape("".join(sorted(_OPERATOR_CHARS))) + "]")
_NOT_ALNUM = re.compile(r"[^\w]|_")  # str patterns: \w is isalnum() or "_"
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
_PUNCTUATION = frozenset({"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"})


def split_command(command: str) -> list[Part] | None:
    """The simple commands in ``command``, or None if it cannot be read with certainty."""
    try:
        return read_command(command)
    except Unreadable:
        return None


def read_command(command: str) -> list[Part]:
    """Like :func:`split_command`, raising :class:`Unreadable` with the reason."""
    read = _read_once(command)
    if isinstance(read, str):
        raise Unreadable(read)
    return list(read)


@lru_cache(maxsize=64)
def _read_once(command: str) -> tuple[Part, ...] | str:
    """One reading per command text, or why it is unreadable: the policy, the
    denied-name check and the grant key of one call all ask (parts are immutable, so
    sharing them is safe)."""
    try:
        if len(command) > MAX_COMMAND_CHARS:
            raise Unreadable("the command is too long to read")
        punctuation = _check_characters(command)
        parts: list[Part] = []
        _Reader(command, parts, 0, _Budget(punctuation)).read_list(end=None)
    except Unreadable as exc:
        return str(exc)
    return tuple(parts)


def _check_characters(command: str) -> frozenset[str]:
    """Refuse control characters, and characters outside ASCII that are invisible or
    look like shell syntax; return those outside ASCII that are punctuation or symbols
    (refused where unquoted). The text outside ASCII is checked whole, in C loops, so
    the cost stays a few milliseconds for 64 KB of distinct characters:
    ``isprintable`` is false exactly for the invisible categories, and text NFKC leaves
    alone has no character that normalises to an operator."""
    control = _CONTROL.search(command)
    if control is not None:
        raise Unreadable(f"control character {control.group()!r}")
    if command.isascii():  # nearly every command: nothing outside ASCII to look at
        return frozenset()
    wide = "".join(_WIDE_RUN.findall(command))
    if not wide.isprintable():
        invisible = next(ch for ch in wide if not ch.isprintable())
        raise Unreadable(f"character {invisible!r} is invisible")
    if not unicodedata.is_normalized("NFKC", wide):
        # Each character normalised on its own: a NUL before each one (nothing composes
        # with NUL, and nothing normalises to it), so the NULs before an operator in the
        # result count the characters before the one that made it.
        forms = unicodedata.normalize("NFKC", wide.replace("", "\x00"))
        operator = _OPERATOR.search(forms)
        if operator is not None:
            culprit = wide[forms.count("\x00", 0, operator.start()) - 1]
            raise Unreadable(f"character {culprit!r} looks like shell syntax")
    others = set(_NOT_ALNUM.findall(wide))  # marks, punctuation and symbols
    return frozenset(ch for ch in others if unicodedata.category(ch) in _PUNCTUATION)


class _Budget:
    """What is left of ``MAX_WORDS`` and ``MAX_STEPS`` for one command, shared by its
    nested readers."""

    __slots__ = ("punctuation", "steps", "words")

    def __init__(self, punctuation: frozenset[str]) -> None:
        self.words = MAX_WORDS
        self.steps = MAX_STEPS
        self.punctuation = punctuation  # what the command holds outside ASCII that may not stand unquoted

    def word(self) -> None:
        self.words -= 1
        if self.words < 0:
            raise Unreadable(f"more than {MAX_WORDS} words and substitutions (too long to judge with certainty)")

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise Unreadable(f"more than {MAX_STEPS} quotes, escapes and operators (too long to judge with certainty)")


class _Reader:
    def __init__(self, text: str, parts: list[Part], depth: int, budget: _Budget) -> None:
        if depth > _MAX_DEPTH:
            raise Unreadable("substitutions nested too deeply")
        budget.word()
        self.budget = budget
        self.text = text
        self.i = 0
        self.parts = parts
        self.depth = depth
        self.heredocs: list[tuple[str, bool, bool]] = []  # (delimiter, quoted, strip tabs)
        self.awaiting = ""  # an operator read (&&, ||, |) that still needs its command
        self.had_command = False  # a command (or subshell) since the last separator

    def peek(self, offset: int = 0) -> str:
        j = self.i + offset
        return self.text[j] if j < len(self.text) else ""

    # ---- lists of commands --------------------------------------------------------

    def read_list(self, end: str | None) -> None:
        simple = Simple()
        while True:
            ch = self.peek()
            if ch == "":
                if end is not None:
                    raise Unreadable("unbalanced parenthesis")
                self._finish(simple)
                self._check_complete()
                return
            if ch in " \t":
                self.i += 1
                continue
            if ch == "\\" and self.peek(1) == "\n":
                self.i += 2
                continue
            if ch == "#":  # here a word would start: a comment
                while self.peek() not in ("", "\n"):
                    self.i += 1
                continue
            if ch == "\n":
                self.i += 1
                self._finish(simple)
                simple = Simple()
                self.had_command = False
                self._read_heredoc_bodies()
                continue
            if ch == ")":
                if end != ")":
                    raise Unreadable("unbalanced parenthesis")
                self.i += 1
                self._finish(simple)
                self._check_complete()
                return
            if ch == "(":
                if simple.words or self.peek(1) == "(":
                    raise Unreadable("'(' where a command cannot start it (function definition or arithmetic)")
                self.i += 1
                self.read_nested(end=")")
                self._command_seen()
                continue
            if ch in ";|" or (ch == "&" and self.peek(1) != ">"):
                operator = self._read_separator()
                if not (self.had_command or simple.words or simple.redirects):
                    raise Unreadable(f"{operator!r} with no command before it (not valid shell)")
                self._finish(simple)
                simple = Simple()
                self.had_command = False
                self.awaiting = operator if operator in ("&&", "||", "|", "|&") else ""
                continue
            if ch in "<>" or (ch == "&" and self.peek(1) == ">"):
                self._read_redirection(simple)
                self._command_seen()
                continue
            word = self.read_word()
            if self.peek() in ("<", ">") and (word.unquoted.isdigit() or re.fullmatch(r"\{\w+\}", word.unquoted)):
                self._read_redirection(simple)  # ``2>file``, ``{fd}>file``: the word is a descriptor
                self._command_seen()
                continue
            simple.words.append(word)
            self._command_seen()

    def _command_seen(self) -> None:
        self.had_command = True
        self.awaiting = ""

    def _check_complete(self) -> None:
        """A list must not end on an operator that needs a command after it (``ls &&``):
        the shell refuses it, so no reading of it can be trusted."""
        if self.awaiting:
            raise Unreadable(f"the command ends with {self.awaiting!r} (not valid shell)")

    def read_nested(self, end: str) -> None:
        """Read a subshell or ``$(…)`` body from the current position up to its ``)``."""
        nested = _Reader(self.text, self.parts, self.depth + 1, self.budget)
        nested.i = self.i
        nested.read_list(end=end)
        if nested.heredocs:
            raise Unreadable("a here-document inside a substitution")
        self.i = nested.i

    def _read_separator(self) -> str:
        two = self.text[self.i : self.i + 2]
        if two in (";;", ";&"):
            raise Unreadable(f"{two!r} belongs to a case statement")
        operator = two if two in ("&&", "||", "|&") else two[0]
        self.i += len(operator)
        return operator

    def _read_redirection(self, simple: Simple) -> None:
        simple.redirects = True
        for op in ("<<<", "<<-", "&>>", "<<", ">>", ">|", "<>", "<&", ">&", "&>", "<", ">"):
            if self.text.startswith(op, self.i):
                self.i += len(op)
                break
        if self.peek() == "(":
            raise Unreadable("process substitution")
        while self.peek() in (" ", "\t"):
            self.i += 1
        if self.peek() in ("", "\n") or self.peek() in _META:
            raise Unreadable("a redirection without a target")
        target = self.read_word()
        if op in ("<<", "<<-"):
            if target.dynamic:
                raise Unreadable("a here-document delimiter with an expansion")
            self.heredocs.append((target.value, target.quoted, op == "<<-"))

    def _read_heredoc_bodies(self) -> None:
        """After a newline: skip the bodies of the here-docs opened on the line before."""
        for delimiter, quoted, strip_tabs in self.heredocs:
            while True:
                if self.i >= len(self.text):
                    raise Unreadable(f"here-document {delimiter!r} never ends")
                end = self.text.find("\n", self.i)
                line = self.text[self.i : end if end >= 0 else len(self.text)]
                self.i = end + 1 if end >= 0 else len(self.text)
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                if not quoted and ("$" in line or "`" in line or "\\" in line):
                    raise Unreadable("a here-document whose body is expanded")
        self.heredocs = []

    def _finish(self, simple: Simple) -> None:
        if simple.words or simple.redirects:
            self.parts.append(part_of(simple))

    # ---- words ----------------------------------------------------------------------

    def read_word(self) -> Word:
        self.budget.word()
        word = Word()
        while True:
            if (run := _PLAIN_RUN.match(self.text, self.i)) is not None:
                text = run.group()
                word.text.append(text)
                word.raw.append(text)
                word.glob = word.glob or _GLOB.search(text) is not None
                self.i = run.end()
            if (run := _WIDE_RUN.match(self.text, self.i)) is not None:
                text = run.group()
                if self.budget.punctuation and not self.budget.punctuation.isdisjoint(text):
                    first = next(ch for ch in text if ch in self.budget.punctuation)
                    raise Unreadable(f"unquoted {first!r} (punctuation or symbol outside ASCII)")
                word.text.append(text)
                word.raw.append(text)
                self.i = run.end()
                continue
            ch = self.peek()
            if ch == "" or ch in _META:
                break
            self.budget.step()
            if ch == "\\":
                nxt = self.peek(1)
                if nxt == "":
                    raise Unreadable("a backslash at the end")
                self.i += 2
                if nxt != "\n":
                    word.text.append(nxt)
                    word.raw.append("")
                    word.quoted = True
                continue
            if ch == "'":
                end = self.text.find("'", self.i + 1)
                if end < 0:
                    raise Unreadable("unbalanced single quote")
                word.text.append(self.text[self.i + 1 : end])
                word.raw.append("")
                word.quoted = True
                self.i = end + 1
                continue
            if ch == '"':
                self.i += 1
                self._read_double_quoted(word)
                word.quoted = True
                continue
            if ch == "$":
                self._read_dollar(word, quoted=False)
                continue
            if ch == "`":
                self._read_backticks(word, in_double_quotes=False)
                continue
            self.i += 1
            word.text.append(ch)
            word.raw.append(ch)
        unquoted = word.unquoted
        if "{" in unquoted and _brace_expansion(unquoted):
            raise Unreadable("brace expansion")
        return word

    def _read_double_quoted(self, word: Word) -> None:
        while True:
            run = _QUOTED_RUN.match(self.text, self.i)
            if run is not None:
                word.text.append(run.group())
                self.i = run.end()
            ch = self.peek()
            if ch == "":
                raise Unreadable("unbalanced double quote")
            self.budget.step()
            if ch == '"':
                self.i += 1
                return
            if ch == "\\":
                nxt = self.peek(1)
                if nxt in ("$", "`", '"', "\\"):
                    word.text.append(nxt)
                    self.i += 2
                elif nxt == "\n":
                    self.i += 2
                else:
                    word.text.append("\\")
                    self.i += 1
                continue
            if ch == "$":
                self._read_dollar(word, quoted=True)
                continue
            if ch == "`":
                self._read_backticks(word, in_double_quotes=True)
                continue
            word.text.append(ch)
            self.i += 1

    def _read_dollar(self, word: Word, *, quoted: bool) -> None:
        simple = _DOLLAR_NAME.match(self.text, self.i)
        if simple is not None:  # ``$name`` (or ``$1``, ``$?`` ...): nearly every expansion
            self.i = simple.end()
            word.text.append(simple.group())
            word.raw.append("$")
            word.dynamic = True
            return
        if self.text.startswith("\\\n", self.i + 1):
            # The shell removes a line continuation before it reads ``$``: ``$\<newline>(x)``
            # is ``$(x)``, a substitution that reads here like a literal dollar.
            raise Unreadable("a line continuation right after $")
        nxt = self.peek(1)
        if nxt in ("'", '"') and not quoted:
            raise Unreadable(f"${nxt}…{nxt} quoting")
        if nxt == "(":
            if self.peek(2) == "(":
                raise Unreadable("arithmetic expansion")
            self.i += 2
            self.read_nested(end=")")
            word.text.append(SUBST)
            word.raw.append("$")
            word.dynamic = True
            return
        if nxt == "{":
            end = self.text.find("}", self.i + 2)
            body = self.text[self.i + 2 : end] if end >= 0 else ""
            if end < 0 or re.search(r"[$`'\"\\{(\[]", body):
                raise Unreadable("a parameter expansion this reader cannot follow")
            if not _POSIX_EXPANSION.match(body):
                # bash's own forms (${x@P}, ${!x}, ${x/a/b}, ${x:1}, ${x^}) can expand prompt
                # escapes, name other variables or run command substitutions kept in a value
                raise Unreadable(f"a parameter expansion beyond POSIX: ${{{body}}}")
            self.i = end + 1
            word.text.append("${" + body + "}")
            word.raw.append("$")
            word.dynamic = True
            return
        if nxt == "[":
            raise Unreadable("$[…] arithmetic")
        self.i += 1
        match = _NAME.match(self.text, self.i)
        if match is None:  # a lone ``$`` is a literal dollar
            word.text.append("$")
            word.raw.append("$")
            return
        self.i = match.end()
        word.text.append("$" + match.group())
        word.raw.append("$")
        word.dynamic = True

    def _read_backticks(self, word: Word, *, in_double_quotes: bool) -> None:
        """The old form of substitution: inside it a backslash escapes only $ ` \\ (and "
        when the backticks are themselves in double quotes)."""
        escapable = ("$", "`", "\\", '"') if in_double_quotes else ("$", "`", "\\")
        body: list[str] = []
        self.i += 1
        while True:
            if (run := _BACKTICK_RUN.match(self.text, self.i)) is not None:
                body.append(run.group())
                self.i = run.end()
            ch = self.peek()
            if ch == "":
                raise Unreadable("unbalanced backtick")
            self.budget.step()
            if ch == "`":
                self.i += 1
                break
            if ch == "\\" and self.peek(1) in escapable:
                body.append(self.peek(1))
                self.i += 2
                continue
            body.append(ch)
            self.i += 1
        nested = _Reader("".join(body), self.parts, self.depth + 1, self.budget)
        nested.read_list(end=None)
        if nested.heredocs:
            raise Unreadable("a here-document inside a substitution")
        word.text.append(SUBST)
        word.raw.append("$")
        word.dynamic = True


def _brace_expansion(text: str) -> bool:
    """Whether ``text`` holds a brace the shell would expand (``{a,b}``, ``{1..3}``)."""
    return any("," in body or ".." in body for body in _BRACE_BODY.findall(text))
