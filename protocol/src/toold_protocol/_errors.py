"""Error vocabulary shared by the daemon and every client.

Two kinds of error travel on the wire:

* ``ToolErrorInfo`` inside a ``ToolResult``: a tool call failed (bad arguments,
  sandbox violation, timeout, ...). ``type`` is one of :class:`ToolErrorType`
  (the ToolError names plus a few file errors); ``code`` is a stable
  SCREAMING_SNAKE string that programs can switch on.
* an ``error`` message: a *request* failed (malformed frame, unknown batch, ...).
  Its ``code`` is one of :class:`ProtocolErrorCode`.
"""

from __future__ import annotations

import enum


class ToolErrorType(enum.StrEnum):
    BAD_ARGS = "BadArgs"
    TIMEOUT = "Timeout"
    SANDBOX_VIOLATION = "SandboxViolation"
    EXECUTION_FAILED = "ExecutionFailed"
    CANCELLED = "Cancelled"
    UNKNOWN_TOOL = "UnknownTool"
    DUPLICATE_TOOL = "DuplicateTool"
    DUPLICATE_TOOL_CALL_ID = "DuplicateToolCallId"
    PATCH_FAILED = "PatchFailed"
    STALE_FILE = "StaleFile"
    FILE_NOT_FOUND = "FileNotFound"
    FILE_EXISTS = "FileExists"
    FILE_TOO_LARGE = "FileTooLarge"
    PERMISSION_DENIED = "PermissionDenied"
    DENIED = "Denied"
    ISOLATION_UNAVAILABLE = "IsolationUnavailable"


class ProtocolErrorCode(enum.StrEnum):
    MALFORMED_FRAME = "MALFORMED_FRAME"
    UNKNOWN_MESSAGE_TYPE = "UNKNOWN_MESSAGE_TYPE"
    INVALID_MESSAGE = "INVALID_MESSAGE"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    MULTIPART_NOT_ALLOWED = "MULTIPART_NOT_ALLOWED"
    PROTOCOL_VERSION_UNSUPPORTED = "PROTOCOL_VERSION_UNSUPPORTED"
    UNKNOWN_BATCH = "UNKNOWN_BATCH"
    DUPLICATE_BATCH_ID = "DUPLICATE_BATCH_ID"
    BATCH_INTERRUPTED = "BATCH_INTERRUPTED"
    NOT_INTERRUPTED = "NOT_INTERRUPTED"
    BATCH_NOT_ENDED = "BATCH_NOT_ENDED"  # undo_batch of a batch still planned, running or interrupted
    JOURNAL_DISABLED = "JOURNAL_DISABLED"
    NOT_AUTHORIZED = "NOT_AUTHORIZED"
    TOO_MANY_BATCHES = "TOO_MANY_BATCHES"
    TOO_MANY_SESSIONS = "TOO_MANY_SESSIONS"
    BACKLOG_OVERFLOW = "BACKLOG_OVERFLOW"
    UNSUPPORTED = "UNSUPPORTED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    WORKSPACE_REFUSED = "WORKSPACE_REFUSED"
    INTERNAL = "INTERNAL"
