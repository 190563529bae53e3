"""Client library for the toold daemon. Depends on toold-protocol and pyzmq only."""

from ._client import BatchOutcome as BatchOutcome
from ._client import CallSpec as CallSpec
from ._client import Client as Client
from ._errors import DaemonUnavailable as DaemonUnavailable
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteError as RemoteError
from ._errors import RequestTimeout as RequestTimeout
from ._errors import TooldError as TooldError
from ._transport import Transport as Transport
from ._transport import ZmqTransport as ZmqTransport

__all__ = [
    "BatchOutcome",
    "CallSpec",
    "Client",
    "DaemonUnavailable",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "TooldError",
    "Transport",
    "ZmqTransport",
]
