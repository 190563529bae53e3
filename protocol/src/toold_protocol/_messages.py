"""Every message of the toold wire protocol.

Each frame is one MessagePack map with a ``type`` tag (``tag_field="type"``).
Tags are written out explicitly so that renaming a class never changes the wire.
Unknown fields are ignored when decoding (msgspec's default), so that a newer peer
can add fields with defaults without breaking an older one.

Requests from a client carry an integer ``id``; the daemon's direct reply echoes
it. Events about a batch (``call_started``, ``output_chunk``, ...) carry the
``batch_id`` instead. ``docs/protocol.md`` describes the conversations.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ._version import PROTOCOL_VERSION

RequestId = Annotated[int, Meta(ge=0, le=2**63 - 1)]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]
#: A batch id a client chooses; the daemon keeps it in the client's uid namespace
#: (``abc`` from uid 1000 is ``1000:abc``), so references allow room for the prefix.
ChosenBatchId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
BatchId = Annotated[str, Meta(min_length=1, max_length=160, pattern=r"^[A-Za-z0-9._:-]+$")]
ToolName = Annotated[str, Meta(min_length=1, max_length=128)]
#: Calls one ``submit_batch`` may carry (a longer list is an invalid message). Planning
#: runs on the daemon's event loop, so what one frame costs it must not grow without
#: bound. Of these, the daemon runs its ``max_tool_calls_per_batch`` (at most this many)
#: and answers the calls past them with errors.
MAX_CALLS_PER_BATCH = 256

RiskLevel = Literal["low", "medium", "high"]
ToolFormat = Literal["toold", "openai", "anthropic", "gemini"]
EventMode = Literal["all", "results"]
Disposition = Literal["run", "confirm", "pending", "resolved"]
BatchState = Literal["planned", "awaiting_confirmation", "running", "finished", "cancelled", "interrupted"]
Stream = Literal["stdout", "stderr"]
ToolsMode = Literal["disabled", "parse_only", "enabled"]


class _Message(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    """Base of every protocol message."""


# --------------------------------------------------------------------------- shared data


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    """Who a session is, as the kernel told the daemon (SO_PEERCRED), never as claimed."""

    uid: int
    gid: int
    pid: int


class ToolErrorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Why a tool call failed. ``type`` is a ToolErrorType, ``code`` a stable SCREAMING_SNAKE name."""

    type: str
    code: str
    message: str
    details: dict[str, Any] = {}


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """The one result every tool call gets, whatever happened.

    ``content`` is for the model (exact text: a file read round-trips), ``display`` is
    for people (sanitized of terminal control sequences), ``data`` is the structured
    form where a tool has one.
    """

    call_id: str
    ok: bool
    content: str = ""
    display: str = ""
    data: dict[str, Any] | None = None
    error: ToolErrorInfo | None = None
    truncated: bool = False
    duration_ms: float = 0.0


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call in a batch. ``arguments`` stays encoded (a MessagePack map) until the
    tool's own argument type decodes it."""

    call_id: CallId
    name: ToolName
    arguments: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"\x80"))


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the daemon advertises it. ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]
    risk: RiskLevel = "low"
    side_effecting: bool = False
    aliases: list[str] = []
    #: What a result's ``data`` holds ("" when the tool returns text only).
    output: str = ""
    #: The JSON Schema of a successful result's ``data`` ({} when the tool declares none).
    data_schema: dict[str, Any] = {}
    #: The tool reaches outside this machine (the network, a third-party server).
    open_world: bool = False


class PlannedCall(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner decided for one call.

    ``run``: will execute; ``confirm``: waits for a person; ``pending``: parse-only
    mode, waits for ``supply_result``; ``resolved``: already has its (error) result.
    """

    index: int
    call_id: str
    name: str
    disposition: Disposition
    summary: str = ""
    risk: RiskLevel = "low"
    locations: list[str] = []
    result: ToolResult | None = None


class ConfirmationItem(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    name: str
    summary: str
    risk: RiskLevel
    locations: list[str] = []
    diff: str | None = None
    arguments: dict[str, Any] = {}
    #: Why the policy asks, and for a shell command every simple command it runs with
    #: the reason each one asks: nothing that will run is left out.
    reasons: list[str] = []


class IsolationLayer(msgspec.Struct, frozen=True, kw_only=True):
    """One isolation layer and whether this daemon can use it (``toold doctor``)."""

    name: str
    available: bool
    detail: str = ""


# --------------------------------------------------------------------------- client -> daemon


class Hello(_Message, tag="hello", frozen=True):
    id: RequestId
    protocol_version: int = PROTOCOL_VERSION
    client_name: Annotated[str, Meta(max_length=128)] = ""
    client_version: Annotated[str, Meta(max_length=64)] = ""
    #: An absolute directory this session works in: its only root, where relative paths
    #: resolve and commands start. Empty: the daemon's own roots.
    workspace: Annotated[str, Meta(max_length=4096)] = ""
    #: The client process's umask: files its commands and tools make get the modes the
    #: person would get (None: the daemon's private 0077).
    umask: Annotated[int, Meta(ge=0, le=0o777)] | None = None


class ListTools(_Message, tag="list_tools", frozen=True):
    id: RequestId
    format: ToolFormat = "toold"


class SubmitBatch(_Message, tag="submit_batch", frozen=True):
    """Run ``calls`` in order. ``batch_id`` may be chosen by the client (else the daemon
    makes one). ``events="results"`` asks only for ``batch_accepted`` and
    ``batch_finished`` (plus confirmations), which is cheaper for simple callers."""

    id: RequestId
    calls: Annotated[list[ToolCall], Meta(max_length=MAX_CALLS_PER_BATCH)]
    batch_id: ChosenBatchId | None = None
    turn_id: Annotated[str, Meta(max_length=128)] | None = None
    events: EventMode = "all"
    #: How long this batch's confirmation may wait for an answer, instead of the
    #: daemon's ``timeout_seconds`` (bounded by the daemon to a day).
    approval_timeout_seconds: Annotated[float, Meta(gt=0, le=86_400)] | None = None
    #: Plan, validate and judge every call, and compute what mutating calls would change
    #: (diffs, paths), without changing anything or asking anyone; results say so.
    dry_run: bool = False
    #: This client reads ``batch_accepted.outcome``: a batch that finishes while its
    #: acceptance is held may be answered with that one frame (no ``batch_finished``
    #: follows). A daemon that predates the field ignores it and sends both frames.
    outcome_in_acceptance: bool = False
    #: The client process's umask for this batch's files (None: as its hello said, else 0077).
    umask: Annotated[int, Meta(ge=0, le=0o777)] | None = None


class Confirm(_Message, tag="confirm", frozen=True):
    """Answer to a ``confirmation_requested``.

    ``decision``: ``approve_all``, ``approve_selected`` (only ``approved_call_ids``),
    or ``deny_all``. ``modified_arguments`` maps call ids to replacement arguments.
    ``remember_for_workspace``: for a command's new network host, allow it again in this
    workspace for this user from now on (stored by the daemon).
    """

    id: RequestId
    correlation_id: str
    decision: Literal["approve_all", "approve_selected", "deny_all"]
    approved_call_ids: list[str] = []
    modified_arguments: dict[str, msgspec.Raw] = {}
    remember_for_session: bool = False
    remember_for_workspace: bool = False
    reason: str = ""


class Cancel(_Message, tag="cancel", frozen=True):
    id: RequestId
    batch_id: BatchId


class Subscribe(_Message, tag="subscribe", frozen=True):
    """An approver UI asks to see confirmation requests of its uid (or its approver group)."""

    id: RequestId


class SupplyResult(_Message, tag="supply_result", frozen=True):
    """Parse-only mode: a person supplies the result of a pending call."""

    id: RequestId
    batch_id: BatchId
    call_id: CallId
    ok: bool
    content: str = ""


class GetBatch(_Message, tag="get_batch", frozen=True):
    id: RequestId
    batch_id: BatchId


class Ping(_Message, tag="ping", frozen=True):
    id: RequestId


class ListBatches(_Message, tag="list_batches", frozen=True):
    """The journal's batches of this uid (root: everyone's), newest first."""

    id: RequestId
    limit: Annotated[int, Meta(ge=1, le=10_000)] = 100


class ListConnections(_Message, tag="list_connections", frozen=True):
    """Connections MCP servers made through the egress proxy (or were refused), newest
    first: those of this uid's servers (root: everyone's), of ``server`` when given. A
    command's connections are in its result (``get_batch``)."""

    id: RequestId
    server: Annotated[str, Meta(max_length=128)] | None = None
    limit: Annotated[int, Meta(ge=1, le=10_000)] = 100


class Recover(_Message, tag="recover", frozen=True):
    """Decide an ``interrupted`` batch: ``resume`` runs the calls that never started (replies
    ``batch_accepted`` and then the usual events), ``discard`` fails them (replies ``ack``)."""

    id: RequestId
    batch_id: BatchId
    action: Literal["resume", "discard"]


class UndoBatch(_Message, tag="undo_batch", frozen=True):
    """Put back every path a finished batch changed, as a new batch of one
    ``restore_files`` call (replies ``batch_accepted``, then the usual events). A path
    changed since the batch fails the whole undo unless ``force``. Only the batch's uid
    (or root) may undo it."""

    id: RequestId
    batch_id: BatchId
    force: bool = False
    events: EventMode = "all"
    approval_timeout_seconds: Annotated[float, Meta(gt=0, le=86_400)] | None = None


class PruneJournal(_Message, tag="prune_journal", frozen=True):
    """Delete finished batches that ended more than ``older_than_seconds`` ago."""

    id: RequestId
    older_than_seconds: Annotated[float, Meta(ge=0)]


class ExplainPolicy(_Message, tag="explain_policy", frozen=True):
    """What the policy would decide for this call from this session, and which rule decided.
    Nothing runs."""

    id: RequestId
    name: Annotated[str, Meta(max_length=128)]
    arguments: msgspec.Raw = msgspec.Raw(b"\x80")


class ReloadPolicy(_Message, tag="reload_policy", frozen=True):
    """Re-read ``[tools.approval]`` from the daemon's config file (as SIGHUP does). Only a
    session of the daemon's own uid, or root, may ask. A bad new policy keeps the old."""

    id: RequestId


class GetStats(_Message, tag="get_stats", frozen=True):
    """What the daemon has done since it started (``toolctl stats``): root and the daemon's
    own uid see every uid's calls, anyone else their own."""

    id: RequestId


ClientMessage = (
    Hello
    | ListTools
    | SubmitBatch
    | Confirm
    | Cancel
    | Subscribe
    | SupplyResult
    | GetBatch
    | Ping
    | ListBatches
    | ListConnections
    | Recover
    | UndoBatch
    | PruneJournal
    | ExplainPolicy
    | ReloadPolicy
    | GetStats
)


# --------------------------------------------------------------------------- daemon -> client


class Welcome(_Message, tag="welcome", frozen=True):
    id: RequestId
    protocol_version: int
    daemon_version: str
    session_id: str
    identity: Identity
    tools_mode: ToolsMode
    roots: list[str]
    isolation: list[IsolationLayer] = []
    limits: dict[str, int] = {}


class ToolList(_Message, tag="tool_list", frozen=True):
    """``tools`` is always filled; ``formatted`` holds the same tools in the requested
    provider format (OpenAI, Anthropic or Gemini function declarations)."""

    id: RequestId
    format: ToolFormat
    tools: list[ToolDefinition]
    formatted: list[dict[str, Any]] = []


class BatchAccepted(_Message, tag="batch_accepted", frozen=True):
    id: RequestId
    batch_id: str
    calls: list[PlannedCall]
    #: The batch's ``batch_finished`` when it had already finished as it was accepted
    #: (only for a submitter that asked with ``outcome_in_acceptance``): nothing follows.
    outcome: BatchFinished | None = None


class ConfirmationRequested(_Message, tag="confirmation_requested", frozen=True):
    batch_id: str
    correlation_id: str
    calls: list[ConfirmationItem]
    expires_in_ms: int


class CallStarted(_Message, tag="call_started", frozen=True):
    batch_id: str
    call_id: str
    index: int
    name: str


class OutputChunk(_Message, tag="output_chunk", frozen=True):
    """Streamed output of a running call. ``seq`` counts chunks of the call from 0;
    ``coalesced`` says how many producer chunks were merged into this one."""

    batch_id: str
    call_id: str
    stream: Stream
    data: str
    seq: int
    coalesced: int = 1


class CallFinished(_Message, tag="call_finished", frozen=True):
    batch_id: str
    index: int
    result: ToolResult


class BatchFinished(_Message, tag="batch_finished", frozen=True):
    batch_id: str
    state: BatchState
    results: list[ToolResult]


class BatchStatus(_Message, tag="batch_status", frozen=True):
    """Reply to ``get_batch``: the plan and every result so far, in call order."""

    id: RequestId
    batch_id: str
    state: BatchState
    calls: list[PlannedCall]
    results: list[ToolResult]


class Ack(_Message, tag="ack", frozen=True):
    """Reply to a request that has nothing else to say (``cancel``, ``confirm``, ...)."""

    id: RequestId


class Error(_Message, tag="error", frozen=True):
    """A request failed. ``id`` is the request's id when it could be read, else null."""

    id: RequestId | None
    code: str
    message: str
    details: dict[str, Any] = {}


class Pong(_Message, tag="pong", frozen=True):
    id: RequestId


class BatchSummary(msgspec.Struct, frozen=True, kw_only=True):
    batch_id: str
    state: BatchState
    submitted: float  # seconds since the epoch
    calls: int
    uid: int


class BatchList(_Message, tag="batch_list", frozen=True):
    id: RequestId
    batches: list[BatchSummary]


class Connection(msgspec.Struct, frozen=True, kw_only=True):
    """One connection through the egress proxy (a command's, in its result's
    ``data.network``; an MCP server's, in ``ServerConnection``): ``refused`` says why
    when the proxy refused it, else ``allowed_by`` says what allowed it and
    ``sent``/``received`` count its bytes each way."""

    host: str
    port: int
    protocol: str  # connect | http | socks5
    address: str = ""  # what was connected to
    allowed_by: str = ""
    refused: str = ""
    sent: int = 0
    received: int = 0


class ServerConnection(Connection, frozen=True, kw_only=True):
    """One connection of an MCP server, as the journal keeps it."""

    server: str
    uid: int
    ended: float  # seconds since the epoch


class ConnectionList(_Message, tag="connection_list", frozen=True):
    id: RequestId
    connections: list[ServerConnection]


class Pruned(_Message, tag="pruned", frozen=True):
    id: RequestId
    removed: int


class PolicyExplanation(_Message, tag="policy_explanation", frozen=True):
    """``decision``: allow, deny or ask, or ``invalid`` when the call would not even be
    planned (unknown tool, bad arguments, outside the sandbox: ``reason`` says why).
    ``rule`` is the index in ``[[tools.approval.rules]]`` of the rule that decided."""

    id: RequestId
    tool: str
    decision: Literal["allow", "deny", "ask", "invalid"]
    reason: str
    risk: RiskLevel = "low"
    rule: int | None = None


class CallCount(msgspec.Struct, frozen=True, kw_only=True):
    """Calls of one tool that ended with one policy decision (allow, ask, deny, pending,
    invalid) and one outcome (``ok`` or the error code)."""

    tool: str
    decision: str
    outcome: str
    count: int


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """Durations of a tool's most recent calls (``*``: every tool)."""

    tool: str
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


class Stats(_Message, tag="stats", frozen=True):
    """Reply to ``get_stats``. ``scope``: ``all`` uids or the asker's ``own``; ``since``:
    when the daemon started (seconds since the epoch); ``holding``: what it holds now
    (running_batches, sessions, confirmations_waiting, workers, zygotes, journal_bytes,
    audit_records_dropped)."""

    id: RequestId
    scope: Literal["all", "own"]
    since: float
    calls: list[CallCount] = []
    batches: dict[str, int] = {}
    latency: list[Latency] = []
    holding: dict[str, int] = {}


DaemonMessage = (
    Welcome
    | ToolList
    | BatchAccepted
    | ConfirmationRequested
    | CallStarted
    | OutputChunk
    | CallFinished
    | BatchFinished
    | BatchStatus
    | Ack
    | Error
    | Pong
    | BatchList
    | ConnectionList
    | Pruned
    | PolicyExplanation
    | Stats
)
