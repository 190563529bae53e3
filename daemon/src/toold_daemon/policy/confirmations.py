"""Confirmations across processes: who is asked, who may answer, what an answer does.

When a batch has calls the policy asks about, the whole batch is planned first and one
``confirmation_requested`` with a fresh correlation id lists every such call (asked
before anything runs). It goes to the submitting session and to every
subscribed approver session allowed to answer: same uid as the submitter, or a member
of a configured approver group. A ``confirm`` from anyone else is refused and changes
nothing. No answer before the timeout, or a cancelled batch, denies the calls.
"""

from __future__ import annotations

import secrets
import time

import msgspec
import trio

from toold_protocol import Confirm, ConfirmationItem, Identity


class Pending(msgspec.Struct):
    correlation_id: str
    batch_id: str
    owner: Identity
    submitter: bytes  # peer of the submitting session
    items: list[ConfirmationItem]
    expires_at: float
    decided: trio.Event = msgspec.field(default_factory=trio.Event)
    answer: Confirm | None = None
    answered_by: Identity | None = None

    def remaining_ms(self) -> int:
        return max(0, round((self.expires_at - time.monotonic()) * 1000))


def peer_groups(identity: Identity) -> set[int]:
    """The peer's primary and supplementary groups (from /proc, read when it answers)."""
    groups = {identity.gid}
    try:
        with open(f"/proc/{identity.pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    groups.update(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError):
        pass
    return groups


class Approver(msgspec.Struct, frozen=True):
    identity: Identity
    groups: frozenset[int]  # read once, when it subscribed


class Confirmations:
    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}
        self.approvers: dict[bytes, Approver] = {}  # subscribed sessions (peer -> who)

    def subscribe(self, peer: bytes, identity: Identity) -> None:
        self.approvers[peer] = Approver(identity, frozenset(peer_groups(identity)))

    def may_watch(self, peer: bytes, owner: Identity, approver_gids: list[int]) -> bool:
        """May this subscribed session see (and answer for) batches of ``owner``?"""
        approver = self.approvers.get(peer)
        if approver is None:
            return False
        return approver.identity.uid == owner.uid or bool(approver.groups & set(approver_gids))

    def watchers(self, owner: Identity, approver_gids: list[int]) -> list[bytes]:
        return [peer for peer in self.approvers if self.may_watch(peer, owner, approver_gids)]

    def open(
        self, *, batch_id: str, owner: Identity, submitter: bytes, items: list[ConfirmationItem], timeout: float
    ) -> Pending:
        pending = Pending(
            correlation_id=f"conf_{secrets.token_hex(12)}",
            batch_id=batch_id,
            owner=owner,
            submitter=submitter,
            items=items,
            expires_at=time.monotonic() + timeout,
        )
        self.pending[pending.correlation_id] = pending
        return pending

    def close(self, pending: Pending) -> None:
        self.pending.pop(pending.correlation_id, None)

    def may_answer(self, peer: bytes, identity: Identity, pending: Pending, approver_gids: list[int]) -> bool:
        return peer == pending.submitter or self.may_watch(peer, pending.owner, approver_gids)

    def visible_to(self, peer: bytes, identity: Identity, approver_gids: list[int]) -> list[Pending]:
        return [p for p in self.pending.values() if self.may_answer(peer, identity, p, approver_gids)]

    def approver_peers(self, pending: Pending, approver_gids: list[int]) -> list[bytes]:
        return [peer for peer in self.watchers(pending.owner, approver_gids) if peer != pending.submitter]
