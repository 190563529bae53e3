"""What each built-in tool's result ``data`` holds, as types; the JSON Schema a tool
advertises (``ToolDefinition.data_schema``, the MCP bridge's ``outputSchema``) is made
from them, and the tests check real results against those schemas.

A field a tool sets only in some cases is ``UNSET`` by default (absent from the data,
not null); a field that is there but may be null says ``| None``. Unknown fields are
forbidden, so the schema says ``additionalProperties: false`` and a tool that starts
returning something new must say so here first. A dry run's data is the same for every
tool (``DryRunData``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from toold_protocol import Connection


class _Data(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


class NetworkRecord(Connection, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One connection a command made through the egress proxy."""


class NetworkOmitted(_Data):
    """The connections past the ones listed in ``network``, counted."""

    connections: int
    refused: int
    sent: int
    received: int


class CommandData(_Data):
    """``shell``, ``run_code`` and command tools; a background ``shell``: job_id and pid."""

    stdout: str | UnsetType = UNSET
    stderr: str | UnsetType = UNSET
    exit_code: int | UnsetType | None = UNSET  # negative: killed by that signal; null: timed out
    signal: str | UnsetType = UNSET
    duration_ms: float | UnsetType = UNSET
    job_id: str | UnsetType = UNSET
    pid: int | UnsetType = UNSET
    network: list[NetworkRecord] | UnsetType = UNSET
    network_omitted: NetworkOmitted | UnsetType = UNSET


class ReadFileData(_Data):
    path: str
    size: int
    modified: str
    sha256: str | UnsetType = UNSET
    encoding: Literal["utf-8", "base64"] | UnsetType = UNSET
    start_line: int | UnsetType = UNSET
    end_line: int | UnsetType = UNSET
    total_lines: int | UnsetType = UNSET
    binary: bool | UnsetType = UNSET
    truncated: bool | UnsetType = UNSET


class FileRead(_Data):
    path: str
    ok: bool
    size: int | UnsetType | None = UNSET
    error: str | UnsetType = UNSET
    message: str | UnsetType = UNSET


class ReadManyFilesData(_Data):
    files: list[FileRead]
    skipped: int


class DirectoryEntry(_Data):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int | None
    modified: str
    target: str | UnsetType = UNSET


class ListDirectoryData(_Data):
    path: str
    entries: list[DirectoryEntry]
    truncated: bool


class GlobData(_Data):
    matches: list[str]
    count: int
    truncated: bool


class GrepData(_Data):
    matches: int
    truncated: bool
    engine: Literal["ripgrep", "python"]


class WriteFileData(_Data):
    changes: dict[str, Literal["created", "modified"]]
    bytes: int


class EditFileData(_Data):
    changes: dict[str, Literal["modified"]]


class ApplyPatchData(_Data):
    changes: dict[str, Literal["created", "modified", "deleted", "moved"]]


class DeleteFileData(_Data):
    changes: dict[str, Literal["deleted"]]
    deleted: list[str]


class MoveFileData(_Data):
    changes: dict[str, Literal["deleted", "moved"]]


class WebFetchData(_Data):
    status: int
    url: str
    content_type: str
    headers: dict[str, str]
    truncated: bool
    bytes: int
    redirects: list[str]
    matches: int | UnsetType = UNSET


class SearchHit(_Data):
    title: str
    url: str
    snippet: str


class WebSearchData(_Data):
    results: list[SearchHit]
    backend: str


class MemoryData(_Data):
    """get: key, value, found; set: key, created; delete: key, deleted; list: keys."""

    key: str | UnsetType = UNSET
    value: str | UnsetType | None = UNSET
    found: bool | UnsetType = UNSET
    created: bool | UnsetType = UNSET
    deleted: bool | UnsetType = UNSET
    keys: list[str] | UnsetType = UNSET


class Todo(_Data):
    id: str
    task: str
    status: Literal["pending", "in_progress", "completed", "cancelled"]
    created: float


class WriteTodosData(_Data):
    todos: list[Todo]
    id: str | UnsetType = UNSET  # the new todo's, for add


class Job(_Data):
    job_id: str
    state: str
    pid: int | None
    exit_code: int | None
    command: str


class ShellJobsData(_Data):
    """list: jobs; output: job_id, state, exit_code, total_chars, and once the job has
    ended its connections (as a command's); kill: job_id."""

    jobs: list[Job] | UnsetType = UNSET
    job_id: str | UnsetType = UNSET
    state: str | UnsetType = UNSET
    exit_code: int | UnsetType | None = UNSET
    total_chars: int | UnsetType = UNSET
    network: list[NetworkRecord] | UnsetType = UNSET
    network_omitted: NetworkOmitted | UnsetType = UNSET


class DryRunData(_Data):
    dry_run: bool
    policy: Literal["allow", "ask", "deny"]
    reason: str
    paths: list[str] | UnsetType = UNSET
    diff: str | UnsetType = UNSET


def data_schema(data_type: type[Any] | None) -> dict[str, Any]:
    """The JSON Schema of ``data_type``, rooted at the object itself (an MCP
    ``outputSchema`` must be an object schema, not a reference); {} for None."""
    if data_type is None:
        return {}
    if data_type not in _schemas:
        _schemas[data_type] = _schema_of(data_type)
    return _schemas[data_type]


_schemas: dict[type[Any], dict[str, Any]] = {}


def _schema_of(data_type: type[Any]) -> dict[str, Any]:
    schema = msgspec.json.schema(data_type)
    definitions: dict[str, Any] = schema.pop("$defs", {})
    reference = schema.get("$ref", "")
    root = dict(definitions.pop(reference.rsplit("/", 1)[-1], schema)) if reference else schema
    if definitions:
        root["$defs"] = definitions
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return root
