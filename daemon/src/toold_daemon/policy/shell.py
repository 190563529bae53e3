"""Splitting a shell command into the simple commands it runs, so each can be judged.

``split_command("git status && curl x | sh")`` → ``[Part("git status"), Part("curl x"), Part("sh")]``.
Separators ``;`` ``&&`` ``||`` ``|`` ``&`` and newlines split; ``$(…)``, backticks and
``( … )`` subshells contribute their inner commands as parts of their own; a part with
a redirection (``>``, ``>>``, ``<``, ``2>``, ``&>``, here-docs) is flagged, because a rule
that allows ``echo`` must not allow ``echo x > ~/.bashrc``.

A part whose program is only known when it runs (``eval``, ``$CMD``, a substitution in
the command word) is marked ``opaque``; text this splitter cannot read with certainty
(unbalanced quotes or parentheses, process substitution ``<(…)``) makes it return
``None``. Either way the caller must ask, never allow.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

_SEPARATORS = {";", "&&", "||", "|", "&", "|&", "\n"}
_REDIRECTIONS = {">", ">>", "<", "<<", "<<<", ">|", "&>", "&>>", "<>", ">&", "<&"}
# Programs that run another command given as arguments: what they run is judged as unknown.
_UNREADABLE_WORDS = {
    "eval", "exec", "source", ".", "command", "builtin", "env", "sudo", "doas", "xargs",
    "nohup", "timeout", "nice", "ionice", "time", "setsid", "stdbuf", "chroot", "su",
}  # fmt: skip
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish", "busybox"}


@dataclass(frozen=True, slots=True)
class Part:
    words: tuple[str, ...]
    redirects: bool = False
    opaque: bool = False  # the program it runs is not known before it runs (``$CMD``, ``eval``)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def split_command(command: str) -> list[Part] | None:
    """The simple commands in ``command``, or None if it cannot be split with certainty."""
    if len(command) > 64 * 1024 or "\x00" in command:
        return None
    try:
        inner, outer = _extract_substitutions(command)
    except ValueError:
        return None
    parts: list[Part] = []
    for text in [outer, *inner]:
        split = _split_simple(text)
        if split is None:
            return None
        parts.extend(split)
    return parts


def _extract_substitutions(command: str) -> tuple[list[str], str]:
    """Pull ``$(…)``, backtick and ``( … )`` bodies out (recursively) and leave a placeholder word."""
    inner: list[str] = []
    out: list[str] = []
    i, n = 0, len(command)
    quote: str | None = None
    while i < n:
        ch = command[i]
        if quote == "'":
            out.append(ch)
            if ch == "'":
                quote = None
            i += 1
            continue
        if ch == "\\" and i + 1 < n:
            out.append(command[i : i + 2])
            i += 2
            continue
        if ch == "'" and quote is None:
            quote = "'"
            out.append(ch)
            i += 1
            continue
        if ch == '"':
            quote = None if quote == '"' else '"'
            out.append(ch)
            i += 1
            continue
        if ch in "<>" and command.startswith("(", i + 1):
            raise ValueError("process substitution")
        if ch == "`":
            end = command.find("`", i + 1)
            if end < 0:
                raise ValueError("unbalanced backtick")
            body = command[i + 1 : end]
            nested, rest = _extract_substitutions(body)
            inner.extend([rest, *nested])
            out.append(_placeholder(quote))
            i = end + 1
            continue
        if ch == "(" or (ch == "$" and command.startswith("$(", i)):
            start = i + (2 if ch == "$" else 1)
            end = _matching_paren(command, start)
            body = command[start:end]
            nested, rest = _extract_substitutions(body)
            inner.extend([rest, *nested])
            out.append(_placeholder(quote) if ch == "$" else " ; ")
            i = end + 1
            continue
        if ch == ")":
            raise ValueError("unbalanced parenthesis")
        out.append(ch)
        i += 1
    if quote is not None:
        raise ValueError("unbalanced quote")
    return inner, "".join(out)


def _placeholder(quote: str | None) -> str:
    return "__SUBST__" if quote == '"' else " __SUBST__ "


def _matching_paren(text: str, start: int) -> int:
    depth, quote, i = 1, None, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "\\":
            i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced parenthesis")


def _split_simple(text: str) -> list[Part] | None:
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    parts: list[Part] = []
    words: list[str] = []
    redirects = False
    for token in tokens:
        if token in _SEPARATORS or (set(token) <= set(";&|") and token):
            if words:
                parts.append(Part(tuple(words), redirects))
            words, redirects = [], False
            continue
        if token in _REDIRECTIONS or (set(token) <= set("<>&") and token):
            redirects = True
            continue
        words.append(token)
    if words:
        parts.append(Part(tuple(words), redirects))
    return [_mark_opaque(part) for part in parts]


def _mark_opaque(part: Part) -> Part:
    first = _command_word(part.words)
    if first is None or first in _UNREADABLE_WORDS or "$" in first or "__SUBST__" in first:
        return Part(part.words, part.redirects, opaque=True)
    if first.rsplit("/", 1)[-1] in _SHELLS and len(part.words) > 1:
        return Part(part.words, part.redirects, opaque=True)
    return part


def _command_word(words: tuple[str, ...]) -> str | None:
    """The word that names the program, after leading ``VAR=value`` assignments."""
    for word in words:
        if "=" in word and not word.startswith("=") and word.split("=", 1)[0].isidentifier():
            continue
        return word
    return None


def matches_prefix(part: Part, prefix: str) -> bool:
    """Does ``part`` start with the words of ``prefix``? (``git`` matches ``git log``, not ``gitx``.)"""
    wanted = prefix.split()
    words = list(part.words)
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        words.pop(0)
    return bool(wanted) and words[: len(wanted)] == wanted
