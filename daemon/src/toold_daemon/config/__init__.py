"""Daemon configuration: one TOML file ([daemon], [tools], [tools.*]), decoded into frozen Structs.

Every setting has a default, so no file is needed. Unknown keys are errors (a typo
should not silently do nothing), reported with the file and line. This module is
pure: reading a file and checking what needs the policy or the tools is ``config_loading``'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from toold_protocol import MAX_CALLS_PER_BATCH, SOCKET_NAME, default_runtime_dir

PositiveInt = Annotated[int, Meta(ge=1)]
Seconds = Annotated[float, Meta(gt=0, le=86400)]

DEFAULT_DENIED_PATTERNS = (
    "**/.ssh/**",
    "**/.gnupg/**",
    "**/id_rsa*",
    "**/id_dsa*",
    "**/id_ecdsa*",
    "**/id_ed25519*",
    "**/*.pem",
    "**/*.key",
    "**/*.p12",
    "**/*.pfx",
    "**/.env*",
    "**/.git-credentials",
    "**/.netrc",
    "**/.npmrc",
    "**/.pypirc",
    "**/.aws/credentials",
    "**/.docker/config.json",
    "**/.kube/config",
    "**/etc/shadow",
    "**/etc/gshadow",
    "**/etc/sudoers",
)

# Paths that make other programs run code the next time they are used, wherever they lie
# below a root: git hooks and config, Python's start-up hooks, package managers' and
# network tools' configuration, editor tasks, direnv, dev containers; and the shell
# start-up files at a root (a home). Every dot-entry directly in a home directory is
# protected besides these (``~/.*``, see sandbox/homes.py).
DEFAULT_PROTECTED_PATTERNS = (
    "**/.git",
    "**/.git/**",
    "**/.gitmodules",
    "**/.gitconfig",
    "**/.config/git/**",
    "**/*.pth",
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/.ssh/**",
    "**/.gnupg/**",
    "**/.netrc",
    "**/.npmrc",
    "**/.pypirc",
    "**/pip.conf",
    "**/.docker/**",
    "**/.envrc",
    "**/.vscode",
    "**/.vscode/**",
    "**/.idea",
    "**/.idea/**",
    "**/.devcontainer",
    "**/.devcontainer/**",
    ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases", ".profile", ".zshrc", ".zshenv",
    ".zprofile", ".zlogin", ".config/fish/**", ".config/autostart/**", ".config/systemd/**", ".local/bin/**",
    ".pam_environment",
)  # fmt: skip
#: Names the dot-entries directly in every home directory, protected besides the patterns.
HOME_DOTFILES = "~/.*"
# Names below each root that commands see read-only (a bind mount in their own namespace).
DEFAULT_READONLY_FOR_COMMANDS = (".git",)


#: Where the installed system service reads its configuration.
SYSTEM_CONFIG = Path("/etc/toold/config.toml")
SYSTEM_SPAWNER_SOCKET = "/run/toold-spawner/spawner.sock"  # where toold-spawner.service listens


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class SandboxConfig(_Section, frozen=True):
    allowed_roots: list[str] = []
    denied_patterns: list[str] = []
    allow_absolute: bool = False
    include_default_denies: bool = True
    # Writes by built-in tools to these ask first (creating included), unless an explicit
    # rule allows that tool; added to DEFAULT_PROTECTED_PATTERNS unless the flag is false.
    protected_patterns: list[str] = []
    include_default_protected: bool = True
    # Built-in protected patterns to drop, by their exact text ("**/*.pth", or "~/.*" for
    # the dot-entries directly in every home directory).
    unprotected_patterns: list[str] = []
    # Entries directly below each root that commands (shell, run_code) may read but not
    # change; a rule cannot lift this, the administrator can by emptying the list.
    readonly_for_commands: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_READONLY_FOR_COMMANDS))
    # Commands find denied files below the roots covered by empty read-only stand-ins
    # (those that exist when the workspace's commands start); the search visits at most
    # this many entries, then the layer reports itself partial.
    hide_denied_from_commands: bool = True
    hide_denied_max_entries: PositiveInt = 100_000

    def __post_init__(self) -> None:
        built_in = {*DEFAULT_PROTECTED_PATTERNS, HOME_DOTFILES}
        unknown = [p for p in self.unprotected_patterns if p not in built_in]
        if unknown:
            raise ValueError(f"unprotected_patterns: {unknown[0]!r} is not a built-in protected pattern")


class TimeoutsConfig(_Section, frozen=True):
    default_seconds: Seconds = 30.0
    file_operations_seconds: Seconds = 30.0
    shell_commands_seconds: Seconds = 120.0


class OutputConfig(_Section, frozen=True):
    max_bytes: PositiveInt = 102_400
    max_lines: PositiveInt = 10_000


class EnvironmentConfig(_Section, frozen=True):
    allowlist: list[str] = []
    denylist: list[str] = []


class Condition(_Section, frozen=True, kw_only=True):
    """``param`` of the call's arguments compared with ``value``. ``prefix`` compares whole
    words (for shell commands: ``git`` matches ``git log``, not ``gitx``)."""

    param: str
    operator: Literal["equals", "contains", "startsWith", "matches", "prefix"]
    value: str | list[str]


class Rule(_Section, frozen=True, kw_only=True):
    """A policy rule: tool-specific rules are tried before ``*`` rules; the first
    whose conditions all hold decides. ``uids``/``gids``/``clients`` scope it to identities.
    ``match``/``not_match`` are argument examples checked when the policy loads."""

    tool: str | list[str] = "*"
    decision: Literal["allow", "deny", "ask"]
    conditions: list[Condition] = []
    risk: Literal["low", "medium", "high"] | None = None
    message: str = ""
    uids: list[int] = []
    gids: list[int] = []
    clients: list[str] = []
    # Shell rules: variables a command may set before its program (``NAME=value prog``)
    # and still be decided by this rule; any other assignment asks.
    variables: list[str] = []
    match: list[dict[str, Any]] = []
    not_match: list[dict[str, Any]] = []


class ApprovalConfig(_Section, frozen=True):
    enabled: bool = True  # false: every call is denied ("Tool execution disabled by policy")
    mode: Literal["auto", "prompt", "deny"] = "prompt"
    # The confirmation modes in one word: none = ask for everything, safe = reads run,
    # side effects ask; all = run everything (yolo). Overrides mode when set.
    preset: Literal["none", "safe", "all"] | None = None
    allowlist: list[str] = []
    denylist: list[str] = []
    prompt_side_effects: bool = True
    rules: list[Rule] = []
    # How long a confirmation waits for an answer before its calls are denied.
    timeout_seconds: Annotated[float, Meta(gt=0, le=86_400)] = 300.0
    # Besides the submitting uid, members of these groups may answer its confirmations.
    approver_gids: list[int] = []


class IsolationConfig(_Section, frozen=True):
    """Limits and layers for isolated children. ``require`` names layers (``landlock``,
    ``seccomp``, ``network``, ``no_new_privs``, ``privilege``) without which the daemon
    refuses to run side-effecting tools."""

    require: list[str] = []
    cpu_seconds: PositiveInt = 600
    address_space_mb: PositiveInt = 4096
    file_size_mb: PositiveInt = 1024
    open_files: PositiveInt = 1024
    processes: PositiveInt = 512
    stream_limit_bytes: PositiveInt = 1_048_576
    kill_grace_seconds: Annotated[float, Meta(ge=0, le=30)] = 0.0
    # Cut the network with a network namespace; false: with the seccomp AF_UNIX-only filter
    # (for containers whose own seccomp profile or AppArmor blocks user namespaces).
    network_namespace: bool = True
    # A cgroup per call where the daemon may create them: cgroup.kill (v2); pids.max and a
    # memory limit (v2 when delegated, else v1 hierarchies). false: group and token sweep only.
    cgroups: bool = True
    # Start commands (shell, run_code) from a pre-confined zygote per uid/roots/network by
    # posix_spawn, instead of forking and confining a fresh child for each. false: fork.
    zygotes: bool = True
    # Capabilities (``CAP_NET_BIND_SERVICE`` …) a root client's commands keep; every other
    # one leaves the bounding set before anything of the call runs.
    keep_capabilities: list[str] = []
    # Python tools (reads, writes, edits ...) run in confined, long-lived workers: at most
    # this many at once across all users and workspaces; one idle this long exits.
    max_workers: Annotated[int, Meta(ge=1, le=256)] = 8
    # Workers one uid's calls may hold at once, so that one user's slow calls (a long
    # search, a regex that backtracks until its timeout) cannot leave every other user's
    # reads waiting. 0: all but a quarter of max_workers (at least one kept for others).
    max_workers_per_uid: Annotated[int, Meta(ge=0, le=256)] = 0
    worker_idle_seconds: Annotated[float, Meta(gt=0, le=86_400)] = 300.0

    def __post_init__(self) -> None:
        from .capabilities import capability_number

        for name in self.keep_capabilities:
            try:
                capability_number(name)
            except ValueError:
                raise ValueError(f"keep_capabilities: unknown capability {name!r}") from None


def _check_networks(cidrs: list[str]) -> None:
    import ipaddress

    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(f"allowed_networks: {cidr!r} is not a network (like 10.0.0.0/8)") from None


def endpoint_refusal(endpoint: str) -> str:
    """Why the daemon cannot serve on ``endpoint`` ("" when it can): clients are known by
    the kernel's credentials of a Unix socket, which a TCP peer does not have."""
    if not endpoint or endpoint.startswith("ipc://"):
        return ""
    return (
        f"cannot serve on {endpoint!r}: toold serves only ipc:// (a Unix socket), where the kernel "
        "tells who each client is; a TCP client could not be identified and would be refused"
    )


NetworkMode = Literal["none", "proxy", "host"]


class NetworkConfig(_Section, frozen=True):
    """How commands (``shell``, ``run_code``, command tools) reach the network.

    ``none``: no route out at all. ``proxy``: a network namespace with loopback only,
    whose one way out is a filtering HTTP/SOCKS5 proxy (the variables ``HTTP_PROXY``,
    ``HTTPS_PROXY``, ``ALL_PROXY`` point at it): hosts in ``allowed_domains`` are reached,
    those in ``denied_domains`` never, any other is asked about. ``host``: the host's
    network, unfiltered."""

    mode: NetworkMode = "proxy"
    # Per tool name (shell, run_code, a command tool's name): its mode instead of ``mode``.
    tools: dict[str, NetworkMode] = {}
    allowed_domains: list[str] = []
    denied_domains: list[str] = []
    allowed_ports: list[Annotated[int, Meta(ge=1, le=65535)]] = msgspec.field(default_factory=lambda: [80, 443])
    # CIDRs exempt from the private-address refusal (an intranet, a local test server).
    allowed_networks: list[str] = []
    max_bytes_per_call: PositiveInt = 1 << 30
    # How long a connection waits for a person's answer about a new host.
    ask_timeout_seconds: Annotated[float, Meta(gt=0, le=3600)] = 60.0

    def __post_init__(self) -> None:
        _check_networks(self.allowed_networks)

    def mode_of(self, tool: str) -> NetworkMode:
        return self.tools.get(tool, self.mode)


class ReadFileConfig(_Section, frozen=True):
    max_file_read_bytes: PositiveInt = 204_800
    max_scan_bytes: PositiveInt = 2_097_152


class ApplyPatchConfig(_Section, frozen=True):
    max_patch_bytes: PositiveInt = 524_288


class EditConfig(_Section, frozen=True):
    # edit_file and apply_patch refuse a file this client session has not read, or that
    # changed since (StaleFile). Off: edits apply to whatever is on disk.
    require_read: bool = True


ToolName = Annotated[str, Meta(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")]


class DefinitionConfig(_Section, frozen=True, kw_only=True):
    """A tool known only by its definition (parse-only mode: a person supplies results)."""

    name: ToolName
    description: str
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


class CommandToolConfig(DefinitionConfig, frozen=True, kw_only=True):
    """A tool that runs a program: ``{param}`` inside an ``argv`` element is replaced by
    that argument's value, as part of that one element (never through a shell)."""

    argv: Annotated[list[str], Meta(min_length=1)]
    cwd: str = ""  # relative to the workspace root
    timeout_seconds: Annotated[float, Meta(gt=0, le=86_400)] | None = None
    network: bool = False
    risk: Literal["low", "medium", "high"] = "high"
    side_effecting: bool = True
    env: dict[str, str] = {}


class MemoryConfig(_Section, frozen=True):
    max_key_chars: Annotated[int, Meta(ge=1, le=4096)] = 256
    max_value_bytes: PositiveInt = 65_536
    max_keys: PositiveInt = 10_000  # per user and scope
    # Keys and values of one user in all scopes together (each workspace is a scope of its
    # own, and a user may open any number): one user cannot fill the disk through memory.
    max_bytes_per_user: PositiveInt = 64 * 1024 * 1024


class TodosConfig(_Section, frozen=True):
    max_todos: PositiveInt = 1000  # per user and workspace
    max_task_chars: PositiveInt = 2000
    max_todos_per_user: PositiveInt = 10_000  # in all of one user's workspaces together


class WebConfig(_Section, frozen=True):
    """``web_fetch``: what it may reach and how much it may take."""

    max_download_bytes: PositiveInt = 5 * 1024 * 1024  # a longer body is cut while it streams
    max_length: PositiveInt = 50_000  # characters of content when the call names none
    max_redirects: Annotated[int, Meta(ge=0, le=20)] = 5
    # Ports besides 80 and 443 that URLs may name.
    allowed_ports: list[Annotated[int, Meta(ge=1, le=65535)]] = []
    # CIDRs exempt from the private-address block (an intranet, tests on 127.0.0.1).
    allowed_networks: list[str] = []
    # Host globs (``*.example.com``): denied hosts are refused; a non-empty allowed list
    # is the only hosts that may be fetched.
    denied_hosts: list[str] = []
    allowed_hosts: list[str] = []
    # GET and HEAD to these hosts run without asking under the default policy.
    trusted_hosts: list[str] = []
    # An HTTP proxy for every fetch; the environment's proxy variables are never used.
    proxy: str = ""

    def __post_init__(self) -> None:
        _check_networks(self.allowed_networks)
        if self.proxy and not re.match(r"^https?://[^/\s]+/?$", self.proxy):
            raise ValueError(f"proxy: {self.proxy!r} is not an http:// or https:// proxy URL")


class WebSearchConfig(_Section, frozen=True):
    """``web_search``: which search service answers (none: the tool is not offered)."""

    backend: Literal["", "searxng", "brave", "command"] = ""
    url: str = ""  # the SearXNG instance, or another Brave API endpoint
    api_key_env: str = ""  # the daemon's environment variable holding the Brave key
    command: list[str] = []  # argv; the query is appended, JSON [{title,url,snippet}] expected
    max_results: Annotated[int, Meta(ge=1, le=100)] = 20

    def __post_init__(self) -> None:
        if self.backend == "searxng" and not self.url:
            raise ValueError("backend 'searxng' needs url (the instance, like http://127.0.0.1:8888)")
        if self.backend == "command" and not self.command:
            raise ValueError("backend 'command' needs command (an argv list)")
        if self.backend == "brave" and not self.api_key_env:
            raise ValueError("backend 'brave' needs api_key_env (the variable holding the key)")
        if self.url and not re.match(r"^https?://", self.url):
            raise ValueError(f"url: {self.url!r} is not an http:// or https:// URL")


class ToolsConfig(_Section, frozen=True):
    mode: Literal["disabled", "parse_only", "enabled"] = "enabled"
    allow_parallel: bool = False
    max_tool_calls_per_batch: Annotated[int, Meta(ge=1, le=MAX_CALLS_PER_BATCH)] = 8
    max_tool_iterations_per_user_turn: PositiveInt = 4
    max_tool_args_bytes: PositiveInt = 262_144
    sandbox: SandboxConfig = SandboxConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    output: OutputConfig = OutputConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    approval: ApprovalConfig = ApprovalConfig()
    isolation: IsolationConfig = IsolationConfig()
    network: NetworkConfig = NetworkConfig()
    edit: EditConfig = EditConfig()
    read_file: ReadFileConfig = ReadFileConfig()
    apply_patch: ApplyPatchConfig = ApplyPatchConfig()
    web: WebConfig = WebConfig()
    memory: MemoryConfig = MemoryConfig()
    commands: list[CommandToolConfig] = []
    definitions: list[DefinitionConfig] = []
    todos: TodosConfig = TodosConfig()
    web_search: WebSearchConfig = WebSearchConfig()


class DaemonConfig(_Section, frozen=True):
    endpoint: str = ""
    state_dir: str = ""
    max_frame_bytes: PositiveInt = 8 * 1024 * 1024
    max_batches_per_session: PositiveInt = 16
    max_sessions: PositiveInt = 1024
    # One user cannot take the whole daemon from the others: at most this many sessions,
    # and batches running at once, per uid.
    max_sessions_per_uid: PositiveInt = 256
    max_running_batches_per_uid: PositiveInt = 64
    # Open connections to the socket (counted from accept, before any greeting): past
    # either bound a new connection is shut down at once. The total is also held below
    # the descriptor limit, less a reserve for the journal, workers and the spawner.
    max_connections_per_uid: PositiveInt = 512
    max_connections: PositiveInt = 8192
    finished_batches_kept: PositiveInt = 1000
    # ... and at most this many bytes of their arguments and results (the oldest go first; get_batch then
    # reads them from the journal): 1,000 batches of 8 calls of 100 KB would be 800 MB.
    finished_batches_kept_bytes: PositiveInt = 64 * 1024 * 1024
    shutdown_grace_seconds: Annotated[float, Meta(ge=0, le=600)] = 5.0
    # When the client that submitted a batch disconnects: cancel what it still runs or
    # waits on (kill its commands), or let the batch finish (results stay in the journal).
    on_client_disconnect: Literal["cancel", "finish"] = "cancel"
    # Frames queued for one client that stopped reading; past this the client is treated
    # as disconnected and told so once (BACKLOG_OVERFLOW).
    max_peer_backlog_bytes: Annotated[int, Meta(ge=1 << 20)] = 16 << 20
    # Bytes waiting for all of one uid's clients together (queued, or handed to the socket
    # and not yet read): past it, the client whose reply would go over is cut off the same
    # way. Without it, one user's hundreds of connections that never read would each hold
    # their own backlog.
    max_uid_backlog_bytes: Annotated[int, Meta(ge=1 << 20)] = 128 << 20
    # A separate policy file (the keys of [tools.approval] at top level, rules as [[rules]]);
    # when set it replaces [tools.approval]. Relative to this file's directory.
    policy_file: str = ""
    # Who may have tools run for them; the spawner (the only root process) checks every
    # request itself. None: whoever the socket's owner, group and mode let connect.
    allowed_uids: list[int] | None = None
    allowed_gids: list[int] = []  # members (primary group) of these may too
    # Who may connect at all, as the socket unit's SocketGroup/SocketMode say: the socket's
    # group (a name or a number; "": the daemon's own) and mode, set as it is bound (born
    # 0600, then given the group, then the mode: never wider than asked). With a group, the
    # socket's directory, when the daemon makes it, is 0710 in that group (members may pass).
    socket_group: str = ""
    socket_mode: Annotated[int, Meta(ge=0o600, le=0o666)] = 0o600
    # Tools for root clients. Unset: allowed when the daemon runs as root for itself
    # (no ``user``), refused when it serves others as a system service (``user`` set).
    allow_root_clients: bool | None = None
    # The unprivileged user the protocol process becomes once the spawner runs, the socket
    # is bound and the journal open (the system service's "toold"). "": stay as started.
    user: str = ""
    # The spawner as a process of its own (``toold spawner``, the system package's
    # toold-spawner.service) listening on this Unix socket; ``serve`` then connects to
    # it instead of forking one, and needs no root at all. "": ``serve`` forks its own.
    spawner_socket: str = ""
    # Plugin tools (entry points "toold.tools") to load by entry-point name; unset: all installed.
    plugins: list[str] | None = None
    disabled_plugins: list[str] = []
    # The audit trail (a record per batch, decision, answer, result and sandbox refusal):
    # "auto" sends it to the systemd journal when its socket exists, else key=value lines
    # on stderr; "journal" or "lines" choose; "off" keeps only the SQLite journal.
    audit: Literal["auto", "journal", "lines", "off"] = "auto"
    audit_journal_socket: str = "/run/systemd/journal/socket"
    # Metrics in the Prometheus text format, replaced every metrics_interval_seconds
    # (for node_exporter's textfile collector). "": none.
    metrics_file: str = ""
    metrics_interval_seconds: Annotated[float, Meta(ge=1, le=3600)] = 15.0

    def __post_init__(self) -> None:
        refused = endpoint_refusal(self.endpoint)
        if refused:
            raise ValueError(f"endpoint: {refused}")
        if self.socket_mode & 0o111 or not self.socket_mode & 0o600 == 0o600:
            raise ValueError(f"socket_mode {self.socket_mode:o}: read and write for the owner, no execute bits")
        for name in ("audit_journal_socket", "metrics_file"):
            value = getattr(self, name)
            if value and not value.startswith("/"):
                raise ValueError(f"{name}: {value!r} is not an absolute path")
        if self.spawner_socket and not self.spawner_socket.startswith("/"):
            raise ValueError(f"spawner_socket: {self.spawner_socket!r} is not an absolute path")

    def root_clients_allowed(self) -> bool:
        return self.allow_root_clients if self.allow_root_clients is not None else not self.user


class JournalConfig(_Section, frozen=True):
    enabled: bool = True
    # normal: survives a daemon crash; full: also power loss (one fsync per commit).
    synchronous: Literal["normal", "full"] = "normal"
    retention_days: Annotated[float, Meta(gt=0)] = 30.0
    # What one uid's batches may hold in the journal (arguments, results, pre-images);
    # past it the uid's oldest finished batches are pruned: one user cannot fill the disk.
    max_bytes_per_uid: Annotated[int, Meta(ge=1024 * 1024)] = 1024 * 1024 * 1024
    # Pre-images kept per batch for ``toolctl undo``; a file past it is "not undoable".
    undo_max_bytes_per_batch: Annotated[int, Meta(ge=0)] = 64 * 1024 * 1024
    # Connections kept per MCP server and uid (the newest; a server may connect in a loop).
    server_connections_kept: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000


class McpServerConfig(_Section, frozen=True, kw_only=True):
    """A third-party MCP server (stdio) whose tools join the registry as
    ``mcp__{name}__{tool}``; one instance per user and workspace, confined like a command."""

    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$", max_length=32)]
    command: Annotated[str, Meta(min_length=1)]  # a program's name (on the sanitized PATH) or absolute path
    args: list[str] = []  # ``{workspace}`` is replaced by the session's workspace root
    env: dict[str, str] = {}
    network: bool = False
    # Directories the server's own files live in (an npm prefix, a venv), readable and
    # executable under Landlock besides the system's; the workspace is always writable.
    read_paths: list[str] = []
    # Tool annotations are the server's word: trusted only when the administrator says so
    # (readOnlyHint then makes a tool read-only for the policy, destructiveHint high-risk).
    trust_annotations: bool = False
    risk: Literal["low", "medium", "high"] = "medium"
    timeout_seconds: Seconds = 120.0  # per call
    start_timeout_seconds: Seconds = 30.0  # until its tool list is in

    def __post_init__(self) -> None:
        for path in self.read_paths:
            if not path.startswith("/"):
                raise ValueError(f"read_paths: {path!r} is not an absolute path")
        if "/" in self.command and not self.command.startswith("/"):
            raise ValueError(f"command: {self.command!r} must be a program's name or an absolute path")


class McpConfig(_Section, frozen=True):
    servers: list[McpServerConfig] = []
    idle_seconds: Seconds = 600.0  # an instance nobody called for this long is stopped
    max_instances: PositiveInt = 32  # running at once, over every user and workspace
    # Instances one uid may run at once (each workspace has its own): one user's busy
    # servers cannot have everyone else's calls refused. 0: all but a quarter of max_instances.
    max_instances_per_uid: Annotated[int, Meta(ge=0)] = 0

    def __post_init__(self) -> None:
        names = [server.name for server in self.servers]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"servers: the name {duplicated[0]!r} is used twice")


class Config(_Section, frozen=True):
    daemon: DaemonConfig = DaemonConfig()
    tools: ToolsConfig = ToolsConfig()
    journal: JournalConfig = JournalConfig()
    mcp: McpConfig = McpConfig()


class ConfigError(Exception):
    """A configuration file could not be used; the message names file and line."""


def planned_endpoint(config: Config, endpoint: str) -> str:
    """The endpoint ``serve`` will use, without preparing anything on disk: the command
    line's, else the configuration's, else the default socket in the runtime directory."""
    return endpoint or config.daemon.endpoint or f"ipc://{default_runtime_dir() / SOCKET_NAME}"
