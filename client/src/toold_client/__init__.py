"""Client library for the toold daemon. Depends on toold-protocol and pyzmq only.

``AsyncClient`` is imported on first use: asyncio costs a synchronous user (``toolctl``)
about 25 ms of every start."""

from typing import TYPE_CHECKING, Any

from ._client import APPROVE_ALL as APPROVE_ALL
from ._client import DENY_ALL as DENY_ALL
from ._client import BatchOutcome as BatchOutcome
from ._client import CallSpec as CallSpec
from ._client import Client as Client
from ._client import ConfirmHandler as ConfirmHandler
from ._client import Decision as Decision
from ._errors import DaemonUnavailable as DaemonUnavailable
from ._errors import ProtocolError as ProtocolError
from ._errors import Refused as Refused
from ._errors import RemoteError as RemoteError
from ._errors import RequestTimeout as RequestTimeout
from ._errors import TooldError as TooldError
from ._transport import Transport as Transport
from ._transport import ZmqTransport as ZmqTransport

if TYPE_CHECKING:
    from ._async_client import AsyncClient as AsyncClient


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from ._async_client import AsyncClient

        return AsyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "APPROVE_ALL",
    "DENY_ALL",
    "AsyncClient",
    "BatchOutcome",
    "CallSpec",
    "Client",
    "ConfirmHandler",
    "DaemonUnavailable",
    "Decision",
    "ProtocolError",
    "Refused",
    "RemoteError",
    "RequestTimeout",
    "TooldError",
    "Transport",
    "ZmqTransport",
]
