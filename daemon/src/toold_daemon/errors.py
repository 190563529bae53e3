"""The exception tools and the planner raise; the executor turns it into a result.

::

    ToolError(type, code, message, details)   one class; ``type`` is a ToolErrorType

Foreign exceptions are translated at the executor boundary: ``OSError`` by
:func:`from_os_error`, anything else into ``ExecutionFailed``/``TOOL_FAILED``
with a sanitized message.
"""

from __future__ import annotations

import errno
from typing import Any

from toold_protocol import ToolErrorInfo, ToolErrorType


class ToolError(Exception):
    def __init__(self, type: ToolErrorType, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.type = type
        self.code = code
        self.message = message
        self.details = details
        #: What a mutating tool changed before it failed (``undo.capture``): kept for undo.
        self.changes: list[Any] = []

    def info(self) -> ToolErrorInfo:
        return ToolErrorInfo(type=str(self.type), code=self.code, message=self.message, details=self.details)


def bad_args(message: str, **details: Any) -> ToolError:
    return ToolError(ToolErrorType.BAD_ARGS, "BAD_ARGS", message, **details)


def sandbox_violation(code: str, message: str, **details: Any) -> ToolError:
    return ToolError(ToolErrorType.SANDBOX_VIOLATION, code, message, **details)


def limits_exceeded(message: str, **details: Any) -> ToolError:
    return ToolError(ToolErrorType.SANDBOX_VIOLATION, "LIMITS_EXCEEDED", message, **details)


_OS_ERRORS: dict[int, tuple[ToolErrorType, str, str]] = {
    errno.ENOENT: (ToolErrorType.FILE_NOT_FOUND, "FILE_NOT_FOUND", "File not found"),
    errno.EACCES: (ToolErrorType.PERMISSION_DENIED, "PERMISSION_DENIED", "Permission denied"),
    errno.EPERM: (ToolErrorType.PERMISSION_DENIED, "PERMISSION_DENIED", "Operation not permitted"),
    errno.EISDIR: (ToolErrorType.EXECUTION_FAILED, "IS_A_DIRECTORY", "Is a directory"),
    errno.ENOTDIR: (ToolErrorType.EXECUTION_FAILED, "NOT_A_DIRECTORY", "Not a directory"),
    errno.ELOOP: (ToolErrorType.SANDBOX_VIOLATION, "SYMLINK_REFUSED", "Refusing to follow a symbolic link"),
    errno.EEXIST: (ToolErrorType.FILE_EXISTS, "FILE_EXISTS", "File exists"),
}


def from_os_error(exc: OSError, display_path: str) -> ToolError:
    """Translate an OSError about ``display_path`` (the path as the caller wrote it)."""
    kind, code, text = _OS_ERRORS.get(
        exc.errno or 0, (ToolErrorType.EXECUTION_FAILED, "IO_ERROR", exc.strerror or "I/O error")
    )
    return ToolError(kind, code, f"{text}: {display_path}", path=display_path, errno=exc.errno)


def file_exists(shown: str) -> ToolError:
    return ToolError(
        ToolErrorType.FILE_EXISTS,
        "FILE_EXISTS",
        f"{shown} already exists; pass overwrite=true to replace it",
        path=shown,
    )


def file_not_found(shown: str) -> ToolError:
    return ToolError(ToolErrorType.FILE_NOT_FOUND, "FILE_NOT_FOUND", f"File not found: {shown}", path=shown)
