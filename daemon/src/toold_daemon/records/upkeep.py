"""The journal's upkeep while the daemon serves: retention applied every hour (not only
at start, so that a daemon running for weeks still forgets old batches), and the undo
store's pre-images of pruned batches removed once batches were pruned, for retention
or because their uid was past its share of the journal."""

from __future__ import annotations

import functools
import logging
import sqlite3
from typing import TYPE_CHECKING

import trio

from .journal import Journal

if TYPE_CHECKING:  # the undo package sits above the records it keeps
    from ..undo.ledger import UndoLedger

log = logging.getLogger(__name__)

#: How often the upkeep looks, and how often it applies retention.
LOOK_SECONDS = 60.0
RETENTION_SECONDS = 3600.0
#: Pre-images kept this recently stay whatever the journal says: the rows that name them
#: may still be on their way to it.
RECENT_PRE_IMAGE_SECONDS = 600.0


async def keep_journal_forever(
    journal: Journal,
    ledger: UndoLedger | None,
    retention_days: float,
    *,
    look_seconds: float = LOOK_SECONDS,
    retention_seconds: float = RETENTION_SECONDS,
) -> None:
    pruned_for_space = journal.pruned_for_space
    # The first look is at once: what expired while the daemon was stopped, and pre-images
    # an earlier run left (it may have stopped between a prune and their removal).
    since_retention, collect_due = retention_seconds, True
    while True:
        pruned = 0
        if since_retention >= retention_seconds:
            since_retention = 0.0
            pruned = len(await journal.prune(older_than_seconds=retention_days * 86400))
            if pruned:
                log.info("pruned %d finished batch(es) older than %g days", pruned, retention_days)
        if ledger is not None and (collect_due or pruned or journal.pruned_for_space != pruned_for_space):
            collect_due = False
            pruned_for_space = journal.pruned_for_space
            try:
                referenced = await journal.kept_hashes()
                collect = functools.partial(ledger.store.collect, referenced, recent_seconds=RECENT_PRE_IMAGE_SECONDS)
                removed = await trio.to_thread.run_sync(collect)
            except (OSError, sqlite3.Error) as exc:  # the store or journal unreadable: next time
                log.warning("cannot remove the undo pre-images of pruned batches: %s", exc)
            else:
                if removed:
                    log.info("removed %d undo pre-image(s) of pruned batches", removed)
        await trio.sleep(look_seconds)
        since_retention += look_seconds
