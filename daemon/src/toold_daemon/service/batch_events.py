"""Where a batch's events go: every session listening to it (the per-call events only to
those that asked for all of them), the approvers watching its user, and, for each result
and the batch's end, the audit trail and the metrics. A held acceptance goes out with
the outcome, or carries it (``held_accepts``)."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from toold_protocol import (
    BatchFinished,
    CallFinished,
    CallStarted,
    ConfirmationRequested,
    OutputChunk,
    ToolResult,
    encode,
)

from ..execution.batches import Batch
from .held_accepts import HeldAccepts
from .sessions import Session
from .shared import Shared

_PER_CALL_EVENTS = (CallStarted, CallFinished, OutputChunk)


class BatchEvents:
    def __init__(self, shared: Shared, held: HeldAccepts) -> None:
        self.shared = shared
        self._held = held

    def opened(self, session: Session, batch: Batch, turn: str | None) -> Callable[[msgspec.Struct], None]:
        """A batch about to run: its audit record, the watchers told of it, and where its
        events go from now on."""
        self.shared.audit.batch_accepted(batch, session.client_name, session.workspace, turn)
        emit = self._emitter(session, batch)
        self._announce(session, batch)
        return emit

    def _emitter(self, session: Session, batch: Batch) -> Callable[[msgspec.Struct], None]:
        """Where ``batch``'s events go: its listeners (the per-call ones only to those that
        asked for all events) and the approvers watching its user; the audit trail and the
        metrics observe each result and the end."""
        approver_gids = self.shared.config.tools.approval.approver_gids

        def emit(event: msgspec.Struct) -> None:
            if isinstance(event, CallFinished):
                self._observe(batch, event.index, event.result)
            elif isinstance(event, BatchFinished):
                self._observe_end(batch)
            final = isinstance(event, BatchFinished)
            # A held acceptance goes first, in the same flush, or carries the outcome itself.
            carried_to = None
            if isinstance(event, BatchFinished) and self._held.release(batch.batch_id, event):
                carried_to = session.peer
            frame = None
            listening = set()
            for peer, all_events in batch.listeners:
                listening.add(peer)
                if peer == carried_to:
                    carried_to = None  # once: the same session may also listen as a resubmitter
                    continue
                if all_events or not isinstance(event, _PER_CALL_EVENTS):
                    frame = frame or encode(event)
                    self.shared.send(peer, frame, flush=final)
            # Watchers see every event but confirmation requests (approvers get those on their own).
            confirmations = self.shared.confirmations
            if confirmations.approvers and not isinstance(event, ConfirmationRequested):
                for peer in confirmations.watchers(batch.identity, approver_gids):
                    if peer not in listening:
                        frame = frame or encode(event)
                        self.shared.send(peer, frame, flush=final)

        return emit

    def _announce(self, session: Session, batch: Batch) -> None:
        """Watchers (subscribed approvers of this uid) learn of the batch, then see its events."""
        if not self.shared.confirmations.approvers:
            return
        watchers = self.shared.confirmations.watchers(batch.identity, self.shared.config.tools.approval.approver_gids)
        if any(peer != session.peer for peer in watchers):
            status = batch.status(0)
            for peer in watchers:
                if peer != session.peer:
                    self.shared.send(peer, encode(status))

    def _observe(self, batch: Batch, index: int, result: ToolResult) -> None:
        """A call's result, for the audit trail and the metrics (once per call)."""
        if index in batch.observed:
            return
        batch.observed.add(index)
        call = batch.calls[index]
        self.shared.audit.result(batch, index, result)
        self.shared.metrics.call_finished(batch.identity.uid, call.name, call.decision, result)

    def _observe_end(self, batch: Batch) -> None:
        """Calls that end with their batch (cancelled, or the daemon stopping) send no
        ``call_finished`` of their own: they are observed here."""
        for index, result in enumerate(batch.results):
            if result is not None:
                self._observe(batch, index, result)
        self.shared.metrics.batch_finished(batch.identity.uid, batch.state)
