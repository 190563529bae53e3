"""Exceptions of the client library.

::

    TooldError
     ├── DaemonUnavailable      cannot reach the daemon, or it stopped answering
     │    ├── RequestTimeout    no reply within the timeout
     │    └── Refused           its authentication turned this client away (for good)
     ├── ProtocolError          the daemon sent something this client cannot understand
     └── RemoteError            the daemon answered a request with an ``error`` message

A failed *tool call* is not an exception: it is a ``ToolResult`` with ``ok=False``.
Foreign errors (``zmq.ZMQError``, ``msgspec`` errors) are translated at the
transport and codec boundaries and never escape.
"""

from __future__ import annotations

from typing import Any


class TooldError(Exception):
    """Base of every error this library raises."""


class DaemonUnavailable(TooldError):
    """The daemon could not be reached or stopped answering."""


class RequestTimeout(DaemonUnavailable):
    """No reply arrived within the timeout."""


class Refused(DaemonUnavailable):
    """The daemon's authentication turned this client away (this user is not allowed, or
    the process is one of its tools): trying again does not help."""


class ProtocolError(TooldError):
    """The daemon sent a frame this client cannot decode or did not expect."""


class RemoteError(TooldError):
    """The daemon refused a request; ``code`` is a ProtocolErrorCode string."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}
