"""The audit trail: who ran what, what the policy decided, who answered, how it ended.

One record per batch (when it is accepted), per call's decision (when it is planned),
per answer a person gave, per call's result, and per refusal by the sandbox (a
connection the egress proxy refused, a path the kernel refused). Records go to the
systemd journal through its native protocol when its socket is there, with fields of
their own (``journalctl -u toold TOOLD_UID=1000``), and otherwise as ``key=value``
lines on stderr. Arguments never appear: a call is described by its tool and its
summary, with anything that looks like a credential hidden.

The journal socket is written without blocking: a full socket (journald behind) queues
records in memory, sent in order as soon as it drains; past ``_MAX_WAITING`` records
the oldest are dropped and counted, so a slow journald never stalls the daemon.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import socket
import stat
import string
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TextIO

import trio

from toold_protocol import Identity, ToolResult

from ..redaction import hide_secrets
from .logs import quoted

if TYPE_CHECKING:
    from ..execution.batches import Batch, PreparedCall

log = logging.getLogger(__name__)

JOURNAL_SOCKET = "/run/systemd/journal/socket"
AuditMode = Literal["auto", "journal", "lines", "off"]

#: A call's decision as it was when the batch was accepted: the call, the decision, why.
Decisions = list[tuple["PreparedCall", str, str]]

#: One MESSAGE_ID per kind of record (journalctl MESSAGE_ID=...), stable across releases.
MESSAGE_IDS = {
    "batch": "5f0c6a1e8b9d4c2fa3e17d60b2c4e901",
    "decision": "8d2b7e4c1a5f4e09b6c3d2a1f0e9d802",
    "answer": "2a9e4d7b6c1f4a38b0e5c7d9f1a2b303",
    "result": "c7e1f3a5b9d24e6c8a0b2d4f6e8a0c04",
    "refusal": "e4b8c2d6f0a14b3e9c7d5a3b1f9e7d05",
    "connection": "9b3f5d1e7c2a4f68a1d3e5b7c9f0a206",
}
_PRIORITY = {"batch": 6, "decision": 6, "answer": 5, "result": 6, "refusal": 4, "connection": 6}
_HEADERS = {
    kind: f"MESSAGE_ID={MESSAGE_IDS[kind]}\nPRIORITY={_PRIORITY[kind]}\nSYSLOG_IDENTIFIER=toold\nTOOLD_EVENT={kind}\n"
    for kind in MESSAGE_IDS
}
_MAX_WAITING = 10_000
#: How long the writer lets records gather once one is queued before it builds and sends
#: them. Sent one read at a time, journald (or whoever reads the socket) was woken for
#: every read, on the cores the daemon and its workers run on: a read took 1.05-1.17x
#: its time with the audit off (bench_audit); gathered, 1.00-1.02x.
GATHER_SECONDS = 0.005
_MAX_VALUE = 4096  # characters of one field's value (summaries are shorter already)

Fields = dict[str, str]
#: What a value of an audit line may hold unquoted (a number, an id, a tool name).
_PLAIN = string.ascii_letters + string.digits + "_.:/@+-"


class AuditTrail:
    """Builds the records; ``sink`` writes each one (journal, lines or nowhere).

    Once ``bind_nursery`` has been called (a serving daemon), a record is only queued
    when it happens and is built and written by a task of its own, in order, as soon
    as the event loop has done what was due, and what else was queued within
    ``GATHER_SECONDS``: building and writing the three records of a read cost ~100 µs
    that its client waited for. What a record says is taken when it happens (a decision
    later changed by an approval is recorded as it was). A daemon that stops writes what
    is queued; one killed loses what the loop had not reached, a few milliseconds' worth.
    """

    def __init__(self, sink: Callable[[str, Fields], None] | None) -> None:
        self._sink = sink
        self._queued: collections.deque[Callable[[], None]] | None = None
        self._writer = trio.lowlevel.ParkingLot()

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        if self._sink is not None and self._queued is None:
            self._queued = collections.deque()
            nursery.start_soon(self._write_queued_forever)

    def _record(self, build: Callable[[], None]) -> None:
        if self._queued is None:
            build()
            self._flush_sink()
            return
        self._queued.append(build)
        self._writer.unpark()

    async def _write_queued_forever(self) -> None:
        try:
            while True:
                self.write_queued()  # (no checkpoint between: whatever comes next unparks us)
                await self._writer.park()
                await trio.sleep(GATHER_SECONDS)
        finally:  # stopping: nothing queued is left unwritten
            self.write_queued()

    def write_queued(self) -> None:
        """Build and write every queued record, in order (one failing is logged alone)."""
        queued = self._queued
        while queued:
            build = queued.popleft()
            try:
                build()
            except Exception:
                log.exception("an audit record could not be written")
        self._flush_sink()

    def _flush_sink(self) -> None:
        """Let a sink that gathers records (lines) write what it has, in one go."""
        flush = getattr(self._sink, "flush", None)
        if flush is not None:
            try:
                flush()
            except Exception:
                log.exception("audit records could not be written")

    def batch_accepted(self, batch: Batch, client: str, workspace: str, turn: str | None) -> None:
        if self._sink is None:
            return
        decisions = [(call, *call.policy_decision()) for call in batch.calls]
        self._record(functools.partial(self._batch_accepted, batch, client, workspace, turn, decisions))

    def _batch_accepted(
        self,
        batch: Batch,
        client: str,
        workspace: str,
        turn: str | None,
        decisions: Decisions,
    ) -> None:
        assert self._sink is not None
        fields = _who(batch.identity, batch)
        fields.update(TOOLD_CLIENT=client, TOOLD_WORKSPACE=workspace, TOOLD_CALLS=str(len(batch.calls)))
        if turn:
            fields["TOOLD_TURN"] = turn
        if batch.dry_run:
            fields["TOOLD_DRY_RUN"] = "1"
        message = f"uid {batch.identity.uid} ({client or 'unnamed client'}) submitted {len(batch.calls)} call(s)"
        self._sink("batch", _with_message(fields, message + (" as a dry run" if batch.dry_run else "")))
        for call, decision, why in decisions:
            self._decision(batch, call, decision, why)

    def _decision(self, batch: Batch, call: PreparedCall, decision: str, why: str) -> None:
        assert self._sink is not None
        fields = _of_call(batch, call)
        fields.update(TOOLD_DECISION=decision, TOOLD_RISK=call.risk)
        if call.policy_rule is not None:
            fields["TOOLD_RULE"] = str(call.policy_rule)
        if why:
            fields["TOOLD_REASON"] = hide_secrets(why)
        if call.result is not None and call.result.error is not None:
            fields["TOOLD_ERROR_CODE"] = call.result.error.code
        self._sink("decision", _with_message(fields, f"{call.name}: {decision} ({why or 'no reason given'})"))

    def answered(
        self,
        batch: Batch,
        call: PreparedCall,
        outcome: str,
        by: Identity | None,
        *,
        remembered: str = "",
        host: str = "",
    ) -> None:
        """``outcome``: approved, denied or unanswered; ``host``: a command's new host."""
        if self._sink is None:
            return
        self._record(functools.partial(self._answered, batch, call, outcome, by, remembered=remembered, host=host))

    def _answered(
        self, batch: Batch, call: PreparedCall, outcome: str, by: Identity | None, *, remembered: str, host: str
    ) -> None:
        assert self._sink is not None
        fields = _of_call(batch, call)
        fields["TOOLD_DECISION"] = outcome
        if by is not None:
            fields["TOOLD_ANSWERED_BY"] = str(by.uid)
        if remembered:
            fields["TOOLD_REMEMBERED"] = remembered
        what = call.name
        if host:
            fields["TOOLD_HOST"] = host
            what = f"{call.name}'s connection to {host}"
        who = f"uid {by.uid}" if by is not None else "nobody"
        self._sink("answer", _with_message(fields, f"{what}: {outcome} by {who}"))

    def server_connection(self, server: str, identity: Identity, record: Mapping[str, Any]) -> None:
        """A connection an MCP server made through the egress proxy (``record`` as a
        command's result lists one). A server's connections belong to no one call: this
        record is where they are kept."""
        if self._sink is None:
            return
        self._record(functools.partial(self._server_connection, server, identity, dict(record)))

    def _server_connection(self, server: str, identity: Identity, record: dict[str, Any]) -> None:
        assert self._sink is not None
        host, port = str(record.get("host", "")), str(record.get("port", ""))
        fields: Fields = {
            "TOOLD_UID": str(identity.uid),
            "TOOLD_GID": str(identity.gid),
            "TOOLD_SERVER": server,
            "TOOLD_HOST": host,
            "TOOLD_PORT": port,
            "TOOLD_PROTOCOL": str(record.get("protocol", "")),
            "TOOLD_ADDRESS": str(record.get("address", "")),
            "TOOLD_SENT": str(record.get("sent", 0)),
            "TOOLD_RECEIVED": str(record.get("received", 0)),
        }
        refused = str(record.get("refused", ""))
        if refused:
            fields["TOOLD_REASON"] = hide_secrets(refused)
            said = f"refused ({refused})"
        else:
            fields["TOOLD_ALLOWED_BY"] = str(record.get("allowed_by", ""))
            said = f"{fields['TOOLD_SENT']} bytes out, {fields['TOOLD_RECEIVED']} in"
        self._sink("connection", _with_message(fields, f"MCP server {server}: connection to {host}:{port}, {said}"))

    def result(self, batch: Batch, index: int, result: ToolResult) -> None:
        if self._sink is None:
            return
        self._record(functools.partial(self._result, batch, batch.calls[index], result))

    def _result(self, batch: Batch, call: PreparedCall, result: ToolResult) -> None:
        assert self._sink is not None
        fields = _of_call(batch, call)
        fields.update(
            TOOLD_RESULT="ok" if result.ok else "error",
            TOOLD_DURATION_MS=f"{result.duration_ms:.1f}",
            TOOLD_BYTES=str(len(result.content)),
        )
        if result.truncated:
            fields["TOOLD_TRUNCATED"] = "1"
        ended = "ok"
        if result.error is not None:
            fields.update(TOOLD_ERROR_CODE=result.error.code, TOOLD_ERROR_TYPE=result.error.type)
            ended = f"error {result.error.code}"
        self._sink("result", _with_message(fields, f"{call.name}: {ended} in {result.duration_ms:.0f} ms"))
        self._refusals(batch, call, result)

    def _refusals(self, batch: Batch, call: PreparedCall, result: ToolResult) -> None:
        assert self._sink is not None
        if result.error is not None and result.error.type == "SandboxViolation":
            fields = _of_call(batch, call)
            fields.update(TOOLD_LAYER="paths", TOOLD_REASON=hide_secrets(result.error.message[:_MAX_VALUE]))
            self._sink("refusal", _with_message(fields, f"{call.name}: the sandbox refused: {result.error.message}"))
        for connection in (result.data or {}).get("network", ()):
            if not isinstance(connection, dict) or not connection.get("refused"):
                continue
            fields = _of_call(batch, call)
            host, port = str(connection.get("host", "")), str(connection.get("port", ""))
            fields.update(
                TOOLD_LAYER="network", TOOLD_HOST=host, TOOLD_PORT=port, TOOLD_REASON=str(connection["refused"])
            )
            self._sink("refusal", _with_message(fields, f"{call.name}: connection to {host}:{port} refused"))


def _who(identity: Identity, batch: Batch) -> Fields:
    return {
        "TOOLD_UID": str(identity.uid),
        "TOOLD_GID": str(identity.gid),
        "TOOLD_PID": str(identity.pid),
        "TOOLD_SESSION": batch.session_id,
        "TOOLD_BATCH": batch.batch_id,
    }


def _of_call(batch: Batch, call: PreparedCall) -> Fields:
    fields = _who(batch.identity, batch)
    fields.update(
        TOOLD_CALL=call.call_id,
        TOOLD_INDEX=str(call.index),
        TOOLD_TOOL=call.name,
        TOOLD_SUMMARY=call.summary,  # credentials hidden by the planner when it was made
    )
    return fields


def _with_message(fields: Fields, message: str) -> Fields:
    fields["MESSAGE"] = hide_secrets(message)
    return fields


# --------------------------------------------------------------------------- sinks


def native_record(kind: str, fields: Fields) -> bytes:
    """One journal entry in the native protocol: ``KEY=value`` lines, or for a value
    holding a newline ``KEY``, its length as 64-bit little endian, the bytes, a newline."""
    lines = [_HEADERS[kind]]
    framed = []
    for key, whole in fields.items():
        value = whole[:_MAX_VALUE]
        if "\n" in value:
            framed.append((key, value.encode("utf-8", "replace")))
        else:
            lines.append(f"{key}={value}\n")
    record = "".join(lines).encode("utf-8", "replace")
    for key, data in framed:
        record += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return record


class JournalSink:
    """Sends records to journald's socket without ever blocking the event loop."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self._waiting: collections.deque[bytes] = collections.deque()
        self.dropped = 0
        self._draining = False
        self._nursery: trio.Nursery | None = None
        self._warned_at = 0.0

    def bind_nursery(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def __call__(self, kind: str, fields: Fields) -> None:
        record = native_record(kind, fields)
        if self._waiting:
            self._queue(record)
            return
        try:
            self._sock.sendto(record, self.path)
        except BlockingIOError:
            self._queue(record)
        except OSError as exc:
            self._lost(exc)

    def _queue(self, record: bytes) -> None:
        if len(self._waiting) >= _MAX_WAITING:
            self._waiting.popleft()
            self.dropped += 1
        self._waiting.append(record)
        if not self._draining and self._nursery is not None:
            try:
                self._nursery.start_soon(self._drain)
                self._draining = True
            except RuntimeError:  # the daemon is stopping: ``close`` sends what it can
                self._nursery = None

    async def _drain(self) -> None:
        try:
            while self._waiting:
                await trio.lowlevel.wait_writable(self._sock)
                try:
                    self._sock.sendto(self._waiting[0], self.path)
                except BlockingIOError:
                    # A datagram socket's writability does not say the reader has room.
                    await trio.sleep(0.01)
                    continue
                except OSError as exc:
                    self._lost(exc)
                self._waiting.popleft()
        finally:
            self._draining = False

    def _lost(self, exc: OSError) -> None:
        """journald is gone or refuses (restarting, or the record is too large): count it,
        and say so at most once a minute."""
        self.dropped += 1
        now = time.monotonic()
        if now - self._warned_at > 60:
            self._warned_at = now
            log.warning("audit records could not reach %s: %s (%d lost so far)", self.path, exc.strerror, self.dropped)

    def close(self) -> None:
        """Send what is still waiting, as far as journald takes it now; the rest is lost
        and counted."""
        while self._waiting:
            try:
                self._sock.sendto(self._waiting[0], self.path)
            except OSError as exc:
                self.dropped += len(self._waiting)
                log.warning("%d audit records could not reach %s at stop: %s", len(self._waiting), self.path, exc)
                break
            self._waiting.popleft()
        self._sock.close()


class LineSink:
    """``audit=result uid=1000 batch=... tool=shell result=ok ...`` on stderr, one line each.

    Lines are gathered and written by ``flush``, which the audit trail calls once it has
    built what was queued: a read's three records (and, under load, those of many calls)
    cost one write instead of one each (stderr is line-buffered: a write per line)."""

    def __init__(self, stream: TextIO | None = None, *, journal_priority: bool = False) -> None:
        self._stream = stream
        self._priority = journal_priority
        self._lines: list[str] = []

    def __call__(self, kind: str, fields: Fields) -> None:
        prefix = f"<{_PRIORITY[kind]}>" if self._priority else ""
        words = [f"{prefix}audit={kind}"]
        for key, value in fields.items():
            name = _LINE_NAMES.get(key) or _LINE_NAMES.setdefault(key, key.removeprefix("TOOLD_").lower())
            # plain when it is one safe word (nothing left once its plain characters are
            # stripped from both ends), else quoted
            words.append(f"{name}={value}" if value and not value.strip(_PLAIN) else f"{name}={quoted(value)}")
        self._lines.append(" ".join(words) + "\n")

    def flush(self) -> None:
        if not self._lines:
            return
        text, self._lines = "".join(self._lines), []
        stream = self._stream or sys.stderr
        stream.write(text)
        if not getattr(stream, "line_buffering", False):  # a line-buffered stream has sent it already
            stream.flush()


#: A field's name in a line: ``TOOLD_UID`` is ``uid`` (worked out once per name).
_LINE_NAMES: dict[str, str] = {}


def open_sink(mode: AuditMode, journal_socket: str, *, stderr_is_journal: bool) -> JournalSink | LineSink | None:
    """Where records go: ``auto`` is the journal when its socket exists, else lines."""
    if mode == "off":
        return None
    if mode == "journal" or (mode == "auto" and _is_socket(journal_socket)):
        return JournalSink(journal_socket)
    return LineSink(journal_priority=stderr_is_journal)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
            log.debug("journal socket %s: %s", path, exc)
        return False
