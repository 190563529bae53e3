"""What a tool is: one small module with an argument struct, a risk, a summary and ``run``.

``run`` is synchronous and is called by a runner, in the client's confined tool worker
(or a one-call child): it must not touch trio. It checks ``ctx.cancelled`` in long
loops so that cancellation and timeouts end it promptly.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import msgspec

from ..config import Config
from ..errors import ToolError
from ..output import NOTHING_UNSEEN, Unseen
from ..sandbox import Sandbox

RiskLevel = Literal["low", "medium", "high"]
TimeoutKind = Literal["default", "file", "shell", "undo"]
A = TypeVar("A", bound=msgspec.Struct)


class ToolArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of argument structs: unknown arguments are errors (a misspelt name should not be ignored)."""


class ToolOutput(msgspec.Struct, frozen=True):
    content: str
    display: str | None = None
    data: dict[str, Any] | None = None
    allow_truncation: bool = True
    #: Read-tracking records to store for the session: canonical path -> record
    #: (``sha256:HEX`` for whole-file reads and writes, ``stat:SIZE:MTIME_NS`` for ranges).
    records: dict[str, str] = msgspec.field(default_factory=dict)
    #: Kept after the content by every cut (a command's ``[exit code N]`` line).
    tail: str = ""
    #: Output the tool produced that ``content`` does not hold (counted by the marker).
    unseen: Unseen = NOTHING_UNSEEN
    #: What the call did to each path it declared (``undo.images.Change``), for undo.
    changes: list[Any] = msgspec.field(default_factory=list)


class Command(msgspec.Struct, frozen=True):
    """What a command tool asks the isolated child to run (``shell``, ``run_code``).

    ``files`` are written into the call's private temp dir by the child, as the
    requesting user, before ``argv`` runs; ``{tmp}`` in argv is replaced by that dir."""

    argv: list[str]
    cwd: str
    network: bool = True
    idle_timeout_s: float = 0.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    files: dict[str, str] = msgspec.field(default_factory=dict)
    background: bool = False  # return at once with a job id; the runner keeps reading
    #: Read only what a program needs outside the workspace (libraries, certificates, name
    #: resolution), not the rest of /etc (``run_code``: a snippet, not a user's command).
    narrow_reads: bool = False


_MAKING_CANCEL_EVENTS = threading.Lock()


class ToolContext(msgspec.Struct):
    """Fresh per call."""

    call_id: str
    sandbox: Sandbox
    config: Config
    #: ``cancelled``'s event, made when first asked for (most calls never are).
    cancel_event: threading.Event | None = None
    emit: Callable[..., None] | None = None  # (stream, text[, how many chunks were merged])
    resolved: dict[str, Path] = msgspec.field(default_factory=dict)
    #: Output streamed so far (bounded by the runner), kept for timeout and cancel results.
    partial: list[str] = msgspec.field(default_factory=list)
    #: Streamed output that did not fit in ``partial`` (bytes, lines): counted, not kept.
    partial_dropped: list[int] = msgspec.field(default_factory=lambda: [0, 0])
    #: What this client session has read (canonical path -> record), for stale-file checks.
    reads: dict[str, str] = msgspec.field(default_factory=dict)
    #: Who asked (for tools that act on daemon state scoped to a uid, like shell_jobs).
    identity: Any = None
    #: The daemon's background jobs (set for ``in_daemon`` tools).
    jobs: Any = None
    #: The daemon's per-user memory and todos (``UserState``; set for ``in_daemon`` tools).
    user_state: Any = None
    #: Bytes of pre-images this call may keep for undo (-1: none are taken).
    undo_budget: int = -1
    umask: int = 0o077  # the client's: files the call makes get its modes
    #: Saved file contents by hash (``restore_files`` only, from the daemon's undo store).
    blobs: dict[str, bytes] = msgspec.field(default_factory=dict)
    #: (host, port) -> (allowed, why): asks a person about a host a command wants to reach.
    ask_network: Callable[[str, int], Awaitable[tuple[bool, str]]] | None = None
    #: The runner's own: the call's request already went out (``ToolRunner.begin``).
    begun: Any = None
    #: A command's connections (``network``, ``network_omitted``) when its call ended
    #: without an outcome (timed out, cancelled): the error result carries them.
    network: dict[str, Any] = msgspec.field(default_factory=dict)

    def resolve(self, raw: str, *, follow_last: bool = True) -> Path:
        """The canonical path of a path argument: the one the planner validated,
        or validated now. Opening it later walks it with O_NOFOLLOW, so a symlink swapped in
        since validation is refused rather than followed."""
        path = self.resolved.get(raw)
        return path if path is not None else self.sandbox.resolve(raw, follow_last=follow_last)

    @property
    def cancelled(self) -> threading.Event:
        """Set when the call is cancelled or timed out; a long loop checks it. Made on
        first use: a ``threading.Event`` costs ~2 µs to make, in the daemon and in the
        worker, for every call, and few calls ever look at it. Made under a lock, since
        the loop (to set it) and a tool's thread (to check it) may ask first at once."""
        event = self.cancel_event
        if event is None:
            with _MAKING_CANCEL_EVENTS:
                if self.cancel_event is None:
                    self.cancel_event = threading.Event()
                event = self.cancel_event
        return event

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise _Cancelled


class _Cancelled(Exception):
    """Raised inside a tool when its call was cancelled; the executor already knows why."""


class Tool(Generic[A]):
    name: ClassVar[str]
    description: ClassVar[str]
    args_type: type[A]
    aliases: ClassVar[tuple[str, ...]] = ()
    side_effecting: ClassVar[bool] = False
    #: False for tools that act on the entry a path names (delete, move): a symlink there
    #: is the link itself, never its target.
    follows_last_symlink: ClassVar[bool] = True
    risk: ClassVar[RiskLevel] = "low"
    #: What a result's ``data`` holds, for the model and for clients (tool definitions).
    output: ClassVar[str] = ""
    #: The type of a result's ``data`` (``tools/_data.py``); its JSON Schema is advertised.
    data_type: ClassVar[type[Any] | None] = None
    #: The parameters' JSON Schema when the tool was not written with an argument struct
    #: (tools from the configuration); otherwise derived from ``args_type``.
    json_schema: ClassVar[dict[str, Any] | None] = None
    timeout_kind: ClassVar[TimeoutKind] = "file"
    #: Runs in the daemon (on a worker thread) whatever the client's uid, because it only
    #: touches daemon state that it scopes to ``ctx.identity`` itself (shell_jobs).
    in_daemon: ClassVar[bool] = False
    #: Runs in a fresh confined child per call with the network open for that call
    #: (web tools): tool workers have no network.
    network: ClassVar[bool] = False
    #: Not offered to models (not listed); only the daemon builds its calls (undo).
    internal: ClassVar[bool] = False
    #: The most bytes of arguments a call may carry; None: the configured
    #: ``max_tool_args_bytes``, the bound on what a client may send.
    max_args_bytes: ClassVar[int | None] = None

    def warm(self) -> None:
        """Build, in the spawner before it forks, what each child of this tool would
        otherwise build on first use (compiled patterns, a library's lazy tables)."""

    def warm_planning(self) -> None:
        """Load what planning a call of this tool needs on first use (a library the
        protocol process does not import at start): called once, on a thread, after the
        daemon serves, so that no client's request waits for the import."""

    def unavailable(self, config: Config) -> str:
        """Why this daemon's configuration cannot offer the tool ("" when it can): such a
        tool is not advertised, and a call to it gets this reason."""
        return ""

    def runs_in_daemon(self, config: Config) -> bool:
        """Whether calls run in the daemon on a thread (``in_daemon``) rather than as the client."""
        return self.in_daemon

    def validate(self, args: A) -> None:
        """Checks the schema cannot express (``start_line <= end_line``). Pure; raise ToolError."""

    def paths(self, args: A) -> list[str]:
        """Path arguments to validate against the sandbox while planning."""
        return []

    def summary(self, args: A) -> str:
        """One line for people (≤ 200 chars), derived from the parsed arguments. No I/O."""
        return self.name

    def locations(self, args: A) -> list[str]:
        return self.paths(args)

    def requires_approval(self, args: A) -> bool:
        """Whether these arguments always need a person's yes (``write_file`` overwriting).
        Pure, like ``summary``: decided from the arguments alone."""
        return False

    def risk_for(self, args: A) -> RiskLevel:
        """The risk of this call (a patch that deletes files is riskier than one that edits)."""
        return self.risk

    def prompts(self, args: A, resolved: dict[str, Path], config: Config) -> bool:
        """Whether the default policy asks before this call:
        every side-effecting call unless the tool knows better for these arguments.
        May look at the filesystem (``move_file``: does the destination exist?)."""
        return self.side_effecting

    def high_risk(self, args: A) -> bool:
        """Whether this call asks even where the mode would run it (``auto``), unless the
        allowlist, an allow rule or preset "all" names the tool: a high-risk tool always."""
        return self.risk == "high"

    def grant_scope(self, args: A) -> str | None:
        """What an "allow for this session" answer to this call covers, if the tool
        knows better than its paths (``web_fetch``: the host). None: the planner decides."""
        return None

    def precheck(self, args: A, resolved: dict[str, Path], config: Config) -> None:
        """Raise the ToolError this call is certain to end with, so that nobody is asked
        to approve it (``move_file`` onto an existing file without ``overwrite``). Looks
        at what the daemon can see; the tool checks again when it runs."""

    def runs_inline(self, args: A, ctx: ToolContext) -> bool:
        """True when this call is small, bounded, non-blocking work (a few kilobytes from a
        regular file) that costs less than handing it to a worker: the runner then runs
        it without a thread hop. Default: never."""
        return False

    def command(self, args: A, ctx: ToolContext) -> Command | None:
        """For tools that run a program: what to run. The isolated child then supervises
        it instead of calling ``run``. Default: None (a Python tool)."""
        return None

    def timeout_seconds(self, args: A) -> float | None:
        """A per-call timeout from the arguments (``timeout_ms``), or None for the config's."""
        return None

    def changes(self, args: A, ctx: ToolContext) -> list[Path]:
        """The paths this call may create, change or remove (canonical): their pre-images
        are kept so that ``toolctl undo`` can put them back. Default: none."""
        return []

    def moves(self, args: A, ctx: ToolContext) -> dict[Path, Path]:
        """Of the paths ``changes`` names, those the call moves whole, each to where it
        moves it (canonical both): an undo may move such a path back instead of making
        it again from its saved contents. Default: none."""
        return {}

    def preview(self, args: A, ctx: ToolContext) -> str | None:
        """What the call would change, as a unified diff, without changing anything: shown
        with its confirmation request. Runs with the client's privileges, like ``run``."""
        return None

    def run(self, args: A, ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError


__all__ = ["A", "Command", "RiskLevel", "Tool", "ToolArgs", "ToolContext", "ToolError", "ToolOutput"]
