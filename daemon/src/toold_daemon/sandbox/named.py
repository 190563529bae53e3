"""Which denied files the words of a command name.

The kernel hides denied files that exist when a workspace's commands start (see
``hidden.py``); this is the second, lexical layer: a command whose words name a denied
path — directly (``cat .env``), through an option (``--file=.env``), through a symlink
(``cat notes`` where ``notes -> .env``) or through a glob that expands to one
(``cat .e*``) — is asked about. Globs are expanded against the directory when the
daemon can list it; when it cannot (a private home), a glob that could match a denied
name by the patterns alone counts as naming one.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from .lookups import must_not_wait, refuse_to_wait
from .paths import Sandbox

_GLOB_CHARS = re.compile(r"[*?\[]")
# Bounds on the filesystem work this check does on the daemon's event loop: a command
# with more words, or a glob over a larger directory, is asked about instead.
_MAX_WORDS = 512
_MAX_GLOB_ENTRIES = 10_000


def denied_words(sandbox: Sandbox, words: Iterable[str], cwd: str) -> str | None:
    """``"WORD (pattern)"`` for the first word naming a denied path, else None."""
    if not sandbox.denied_patterns:
        return None  # nothing is denied: no word can name it, and no path is looked at
    looked_at: set[str] = set()  # candidates already found to name nothing denied
    real_dirs: dict[str, str] = {}  # directory -> its real path, for this check
    for count, word in enumerate(words):
        if count >= _MAX_WORDS:
            return f"{word[:60]}… (too many words to check)"
        for candidate in _path_candidates(word):
            if candidate in looked_at:
                continue
            pattern = _denied(sandbox, candidate, cwd, real_dirs)
            if pattern is not None:
                return f"{word[:120]} ({pattern})"
            looked_at.add(candidate)
    return None


def _path_candidates(word: str) -> list[str]:
    """The word, and what follows ``=`` in ``--opt=value``/``NAME=value``."""
    if "\x00" in word:  # a substitution: the command is asked about for that already
        return []
    candidates = [word]
    if "=" in word:
        candidates.append(word.split("=", 1)[1])
    return [c for c in candidates if c and c not in (".", "..", "/")]


def _denied(sandbox: Sandbox, word: str, cwd: str, real_dirs: dict[str, str]) -> str | None:
    path = _expand_home(word)
    absolute = os.path.normpath(os.path.join(cwd, path))
    if _GLOB_CHARS.search(path):
        return _denied_glob(sandbox, absolute, real_dirs)
    return _denied_path(sandbox, absolute, real_dirs)


def _expand_home(word: str) -> str:
    """``~`` and ``~user`` stand for some home directory: any absolute place will do for
    patterns that start with ``**/``."""
    if word.startswith("~"):
        rest = word.split("/", 1)[1] if "/" in word else ""
        return "/home/~/" + rest
    return word


def _denied_path(sandbox: Sandbox, absolute: str, real_dirs: dict[str, str]) -> str | None:
    pattern = _pattern_of(sandbox, absolute)
    if pattern is not None:
        return pattern
    try:  # a symlink (or a directory on the way) that leads to a denied file
        real = _real_path(sandbox, absolute, real_dirs)
    except (OSError, ValueError):
        return None
    return _pattern_of(sandbox, real) if real != absolute else None


def _real_path(sandbox: Sandbox, absolute: str, real_dirs: dict[str, str]) -> str:
    """``os.path.realpath(absolute)`` (normalised), its directory's part worked out once
    per check: a command's words mostly share a directory, and realpath costs a system
    call for every component of it. On the event loop, from the kernel's caches alone,
    but for a word right in a root on a local disk (most words: ``true``, ``status``,
    ``notes.txt`` run in the workspace), looked up there once (``real_name_in_root``)."""
    directory, name = os.path.split(absolute)
    if must_not_wait():
        local = sandbox.local_root_at(directory) if name else None
        real = local.real_name_in_root(name) if local is not None else None
        return real if real is not None else sandbox.canonical(absolute)
    real_dir = real_dirs.get(directory)
    if real_dir is None:
        real_dir = os.path.realpath(directory)
        real_dirs[directory] = real_dir if os.path.isdir(real_dir) else ""  # "": a loop, a file, nothing
    if not real_dir or not name:
        return os.path.realpath(absolute)
    candidate = os.path.join(real_dir, name)
    try:
        is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
    except OSError:
        return candidate  # nothing there to follow, as realpath would find
    return os.path.realpath(candidate) if is_link else candidate


def _pattern_of(sandbox: Sandbox, absolute: str) -> str | None:
    pattern = sandbox.denied_pattern(absolute)
    if pattern is None and sandbox.root_of(absolute) is None:
        # Outside the roots, relative patterns ("**/.ssh/**") still say what a secret is.
        pattern = sandbox.denied_pattern(Path(sandbox.roots[0], absolute.lstrip("/")))
    return pattern


def _denied_glob(sandbox: Sandbox, absolute: str, real_dirs: dict[str, str]) -> str | None:
    directory, name = os.path.split(absolute)
    if _GLOB_CHARS.search(directory):
        return _could_match(sandbox, absolute)
    matcher = re.compile(fnmatch.translate(name))
    hidden_too = name.startswith(".")  # the shell's "*" skips dot files unless the glob starts with "."
    refuse_to_wait()  # a listing may wait for the filesystem: not on the event loop
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count >= _MAX_GLOB_ENTRIES:
                    return f"a glob over more than {_MAX_GLOB_ENTRIES} entries"
                if not matcher.match(entry.name) or (entry.name.startswith(".") and not hidden_too):
                    continue
                pattern = _denied_path(sandbox, entry.path, real_dirs)
                if pattern is not None:
                    return pattern
    except FileNotFoundError:
        return None
    except OSError:
        return _could_match(sandbox, absolute)
    return None


def _could_match(sandbox: Sandbox, absolute: str) -> str | None:
    """Without a directory listing: does the glob's last name match a name a denied
    pattern stands for (``.e*`` matches ``.env``)?"""
    name = os.path.basename(absolute)
    for pattern, example in _examples(sandbox.denied_patterns):
        if example.startswith(".") and not name.startswith("."):
            continue
        if fnmatch.fnmatchcase(example.casefold(), name.casefold()):  # as the sandbox: whatever the case
            return pattern
    return None


@lru_cache(maxsize=64)
def _examples(patterns: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Names each pattern's last literal component stands for: ``**/.env*`` → ``.env``,
    ``.envx``; ``**/*.pem`` → ``.pem``, ``x.pem``; ``**/.ssh/**`` → ``.ssh``."""
    examples: list[tuple[str, str]] = []
    for pattern in patterns:
        names = [part for part in pattern.split("/") if part and part != "**"]
        if not names:
            continue
        last = re.sub(r"\[[^]]*\]", "x", names[-1]).replace("?", "x")
        for filler in ("", "x"):
            examples.append((pattern, last.replace("*", filler)))
    return tuple(examples)
