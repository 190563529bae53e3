"""What the journal hands back and takes: a stored batch with its calls, results and
recorded changes, and a submission to record. Plain values, with the conversions to the
protocol's types."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import cast

import msgspec

from toold_protocol import (
    BatchFinished,
    BatchState,
    BatchStatus,
    Disposition,
    Identity,
    PlannedCall,
    RiskLevel,
    ToolCall,
    ToolResult,
)

_encoder = msgspec.msgpack.Encoder()


class StoredChange(msgspec.Struct, frozen=True):
    index: int
    path: str
    kind: str
    mode: int
    hash: str
    note: str
    after_kind: str
    after_hash: str
    after_mode: int = -1  # the permission bits the batch left (-1: none recorded)
    uid: int = -1  # the owner before (-1: none recorded)
    gid: int = -1  # the group before (-1: none recorded)
    xattrs: dict[str, bytes] = msgspec.field(default_factory=dict)  # the extended attributes before
    moved_to: str = ""  # where the call moved it, not keeping its contents: an undo moves it back


class StoredCall(msgspec.Struct, frozen=True):
    index: int
    call_id: str
    tool: str
    arguments: bytes
    disposition: str
    summary: str
    risk: str
    started: float | None

    def planned(self, result: ToolResult | None) -> PlannedCall:
        return PlannedCall(
            index=self.index,
            call_id=self.call_id,
            name=self.tool,
            disposition=cast(Disposition, self.disposition),
            summary=self.summary,
            risk=cast(RiskLevel, self.risk),
            result=result,
        )

    def tool_call(self) -> ToolCall:
        return ToolCall(call_id=self.call_id, name=self.tool, arguments=msgspec.Raw(self.arguments))


class StoredBatch(msgspec.Struct, frozen=True):
    batch_id: str
    identity: Identity
    client_name: str
    turn_id: str | None
    submitted: float
    finished: float | None
    state: BatchState
    fingerprint: str
    calls: list[StoredCall]
    results: list[ToolResult | None]  # by call index
    workspace: str = ""  # the session's workspace, "" for the daemon's roots

    def plan(self) -> list[PlannedCall]:
        return [call.planned(result) for call, result in zip(self.calls, self.results, strict=True)]

    def finished_results(self) -> list[ToolResult]:
        return [r for r in self.results if r is not None]

    def status(self, request_id: int) -> BatchStatus:
        results = self.finished_results()
        return BatchStatus(id=request_id, batch_id=self.batch_id, state=self.state, calls=self.plan(), results=results)

    def outcome(self) -> BatchFinished:
        return BatchFinished(batch_id=self.batch_id, state=self.state, results=self.finished_results())


class Submission(msgspec.Struct, frozen=True):
    """What the journal records of a submitted batch, whenever it records it."""

    batch_id: str
    identity: Identity
    client_name: str
    turn_id: str | None
    digest: str
    calls: Sequence[ToolCall]
    planned: Sequence[PlannedCall]
    workspace: str = ""  # "" for the daemon's roots


def fingerprint(calls: Sequence[ToolCall]) -> str:
    """What makes two submissions "the same batch": call ids, tool names and argument bytes, in order."""
    digest = hashlib.sha256()
    for call in calls:
        digest.update(_encoder.encode([call.call_id, call.name, bytes(call.arguments)]))
    return digest.hexdigest()
