"""toold wire protocol: message types, codec, error vocabulary. Depends on msgspec only."""

from ._codec import DecodeFailure as DecodeFailure
from ._codec import decode_client_message as decode_client_message
from ._codec import decode_daemon_message as decode_daemon_message
from ._codec import encode as encode
from ._codec import encode_value as encode_value
from ._declarations import declaration as declaration
from ._declarations import gemini_schema as gemini_schema
from ._endpoint import ENDPOINT_ENV as ENDPOINT_ENV
from ._endpoint import SOCKET_NAME as SOCKET_NAME
from ._endpoint import default_endpoint as default_endpoint
from ._endpoint import default_runtime_dir as default_runtime_dir
from ._errors import ProtocolErrorCode as ProtocolErrorCode
from ._errors import ToolErrorType as ToolErrorType
from ._messages import MAX_CALLS_PER_BATCH as MAX_CALLS_PER_BATCH
from ._messages import Ack as Ack
from ._messages import BatchAccepted as BatchAccepted
from ._messages import BatchFinished as BatchFinished
from ._messages import BatchList as BatchList
from ._messages import BatchState as BatchState
from ._messages import BatchStatus as BatchStatus
from ._messages import BatchSummary as BatchSummary
from ._messages import CallCount as CallCount
from ._messages import CallFinished as CallFinished
from ._messages import CallStarted as CallStarted
from ._messages import Cancel as Cancel
from ._messages import ClientMessage as ClientMessage
from ._messages import Confirm as Confirm
from ._messages import ConfirmationItem as ConfirmationItem
from ._messages import ConfirmationRequested as ConfirmationRequested
from ._messages import Connection as Connection
from ._messages import ConnectionList as ConnectionList
from ._messages import DaemonMessage as DaemonMessage
from ._messages import Disposition as Disposition
from ._messages import Error as Error
from ._messages import EventMode as EventMode
from ._messages import ExplainPolicy as ExplainPolicy
from ._messages import GetBatch as GetBatch
from ._messages import GetStats as GetStats
from ._messages import Hello as Hello
from ._messages import Identity as Identity
from ._messages import IsolationLayer as IsolationLayer
from ._messages import Latency as Latency
from ._messages import ListBatches as ListBatches
from ._messages import ListConnections as ListConnections
from ._messages import ListTools as ListTools
from ._messages import OutputChunk as OutputChunk
from ._messages import Ping as Ping
from ._messages import PlannedCall as PlannedCall
from ._messages import PolicyExplanation as PolicyExplanation
from ._messages import Pong as Pong
from ._messages import Pruned as Pruned
from ._messages import PruneJournal as PruneJournal
from ._messages import Recover as Recover
from ._messages import ReloadPolicy as ReloadPolicy
from ._messages import RiskLevel as RiskLevel
from ._messages import ServerConnection as ServerConnection
from ._messages import Stats as Stats
from ._messages import Stream as Stream
from ._messages import SubmitBatch as SubmitBatch
from ._messages import Subscribe as Subscribe
from ._messages import SupplyResult as SupplyResult
from ._messages import ToolCall as ToolCall
from ._messages import ToolDefinition as ToolDefinition
from ._messages import ToolErrorInfo as ToolErrorInfo
from ._messages import ToolFormat as ToolFormat
from ._messages import ToolList as ToolList
from ._messages import ToolResult as ToolResult
from ._messages import ToolsMode as ToolsMode
from ._messages import UndoBatch as UndoBatch
from ._messages import Welcome as Welcome
from ._terminal import sanitize_for_terminal as sanitize_for_terminal
from ._version import MIN_PROTOCOL_VERSION as MIN_PROTOCOL_VERSION
from ._version import PROTOCOL_VERSION as PROTOCOL_VERSION

__all__ = [
    "ENDPOINT_ENV",
    "MAX_CALLS_PER_BATCH",
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "SOCKET_NAME",
    "Ack",
    "BatchAccepted",
    "BatchFinished",
    "BatchList",
    "BatchState",
    "BatchStatus",
    "BatchSummary",
    "CallCount",
    "CallFinished",
    "CallStarted",
    "Cancel",
    "ClientMessage",
    "Confirm",
    "ConfirmationItem",
    "ConfirmationRequested",
    "Connection",
    "ConnectionList",
    "DaemonMessage",
    "DecodeFailure",
    "Disposition",
    "Error",
    "EventMode",
    "ExplainPolicy",
    "GetBatch",
    "GetStats",
    "Hello",
    "Identity",
    "IsolationLayer",
    "Latency",
    "ListBatches",
    "ListConnections",
    "ListTools",
    "OutputChunk",
    "Ping",
    "PlannedCall",
    "PolicyExplanation",
    "Pong",
    "ProtocolErrorCode",
    "PruneJournal",
    "Pruned",
    "Recover",
    "ReloadPolicy",
    "RiskLevel",
    "ServerConnection",
    "Stats",
    "Stream",
    "SubmitBatch",
    "Subscribe",
    "SupplyResult",
    "ToolCall",
    "ToolDefinition",
    "ToolErrorInfo",
    "ToolErrorType",
    "ToolFormat",
    "ToolList",
    "ToolResult",
    "ToolsMode",
    "UndoBatch",
    "Welcome",
    "declaration",
    "decode_client_message",
    "decode_daemon_message",
    "default_endpoint",
    "default_runtime_dir",
    "encode",
    "encode_value",
    "gemini_schema",
    "sanitize_for_terminal",
]
