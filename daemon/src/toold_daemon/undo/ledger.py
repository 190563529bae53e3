"""The protocol process's side of undo: keep what workers captured, plan an undo.

``keep`` stores a call's pre-images in the undo store and hands the journal the rest;
``plan`` turns a journaled batch into the arguments of one ``restore_files`` call (every
path once: the state the batch first found it in, and the state it left it in);
``blobs_for`` gives that call the saved bytes, and only the bytes of the batch it undoes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from ..records.journal import Journal
from ..records.stored_batches import StoredBatch, StoredChange
from .images import Change, Image
from .restore import RestoreArgs
from .store import UndoStore


class Kept(msgspec.Struct, frozen=True):
    changes: list[Change]  # without the bytes, for the journal
    stored_bytes: int
    not_undoable: list[str]  # "path (why)"


class UndoLedger:
    def __init__(self, store: UndoStore, journal: Journal, max_bytes_per_batch: int) -> None:
        self.store = store
        self.journal = journal
        self.max_bytes_per_batch = max_bytes_per_batch

    def keep(self, changes: list[Change]) -> Kept:
        """The call's changes are made already: a pre-image the store cannot take (its
        disk is full) makes that path not undoable, said in the result, and the call's
        result stands."""
        stripped: list[Change] = []
        stored = 0
        for change in changes:
            before = change.before
            if before.kind in ("file", "symlink"):
                try:
                    self.store.put(before.data)
                    stored += len(before.data)
                except OSError as exc:
                    note = f"its earlier content could not be kept: {exc.strerror or exc}"
                    before = Image(path=before.path, kind="unknown", note=note)
            stripped.append(msgspec.structs.replace(change, before=msgspec.structs.replace(before, data=b"")))
        # (a path moved without its contents is put back by moving it back)
        missing = [f"{c.before.path} ({c.before.note})" for c in stripped if c.before.note and not c.before.moved_to]
        return Kept(stripped, stored, missing)

    def plan(self, stored: StoredBatch, *, force: bool, cannot_reverse: Callable[[str], bool]) -> dict[str, Any]:
        """``restore_files`` arguments that undo ``stored``; ``cannot_reverse(tool name)``:
        whether a tool's effects are beyond pre-images (commands)."""
        first: dict[str, StoredChange] = {}
        last: dict[str, StoredChange] = {}
        changes = self.journal.changes(stored.batch_id)
        for change in changes:
            first.setdefault(change.path, change)
            last[change.path] = change
        stale = _stale_tree_hashes(changes, last)
        born = _born_in_the_batch(first)
        moved_back = _moved_back(changes, first, last, kept_too=not force)
        # What was below a path moved back goes back with it, whatever was kept of it; and
        # what the move brought below where it went leaves with it (the destination's tree
        # hash covers it: an entry each made the undo of a tree 1,300 deep name 848,000
        # path components, and it was refused).
        within = _below_any(first, [*moved_back, *moved_back.values()])
        removals = [p for p in first if (first[p].kind == "absent" or p in born) and p not in within]
        restorations = [
            p for p in first if first[p].kind != "absent" and p not in born and p not in moved_back and p not in within
        ]
        # Trees moved back come first, while nothing else has touched where they are or
        # were; then children are removed before their parents, parents made before
        # their children.
        ordered = sorted(removals, key=_depth, reverse=True) + sorted(restorations, key=_depth)
        entries = [_moved_back_entry(path, first[path], last[moved_back[path]]) for path in moved_back] + [
            {
                "path": path,
                "expect_kind": last[path].after_kind,
                "expect_hash": "" if path in stale else last[path].after_hash,
                "expect_mode": last[path].after_mode,
                "kind": "absent" if path in born else first[path].kind,
                "mode": first[path].mode,
                "uid": -1 if path in born else first[path].uid,
                "gid": -1 if path in born else first[path].gid,
                "xattrs": {} if path in born else first[path].xattrs,
                "hash": "" if path in born else first[path].hash,
                "note": "" if path in born else _not_undoable(first[path]),
            }
            for path in ordered
        ]
        return {
            "undoes": stored.batch_id,
            "entries": entries,
            "force": force,
            "irreversible": _irreversible(stored, cannot_reverse),
        }

    async def blobs_for(self, uid: int, args: RestoreArgs) -> dict[str, bytes]:
        """The saved bytes ``args`` names, if the batch it undoes is ``uid``'s (or uid is
        root's) and the journal recorded those hashes for it; nothing otherwise. Read on
        a thread: up to the undo bound, each blob hashed to check it."""
        stored = self.journal.load(args.undoes)
        if stored is None or uid not in (stored.identity.uid, 0):
            return {}
        recorded = {change.hash for change in self.journal.changes(args.undoes)}
        wanted = list(dict.fromkeys(entry.hash for entry in args.entries if entry.hash and entry.hash in recorded))
        return await trio.to_thread.run_sync(self._read_blobs, wanted)

    def _read_blobs(self, names: list[str]) -> dict[str, bytes]:
        blobs: dict[str, bytes] = {}
        for name in names:
            data = self.store.get(name)
            if data is not None:
                blobs[name] = data
        return blobs


def _moved_back(
    changes: list[StoredChange], first: dict[str, StoredChange], last: dict[str, StoredChange], *, kept_too: bool
) -> dict[str, str]:
    """The paths an undo puts back by moving them back (each to where it was moved): a
    call moved them whole, and no other call of the batch changed them, where they went,
    anything below either or anything above them. A later change there would make the
    move back put the wrong thing in place; the undo then makes them again from their
    saved contents, when the call could keep them. A move back is exact (the same
    files: their links, times and attributes) and costs a rename, where making a tree
    again wrote every file of it. Not ``kept_too`` (a forced undo), only those whose
    contents were not kept move back: what was kept is made again as it was, changes
    made since inside it taken back, as a forced undo does with any path."""
    found: dict[str, str] = {}
    for path, change in first.items():
        destination = change.moved_to
        if not destination or last[path] is not change or change.after_kind != "absent":
            continue
        if not kept_too and change.kind != "unknown":
            continue
        if destination not in last or last[destination].index != change.index:
            continue
        if last[destination].after_kind == "absent":
            continue
        if not any(other.index != change.index and _related(other.path, path, destination) for other in changes):
            found[path] = destination
    return found


def _below_any(paths: dict[str, StoredChange], tops: list[str]) -> set[str]:
    """Those of ``paths`` strictly below one of ``tops``."""
    prefixes = tuple(top.rstrip(os.sep) + os.sep for top in tops)
    return {path for path in paths if prefixes and path.startswith(prefixes)}


def _related(other: str, moved: str, destination: str) -> bool:
    """Whether ``other`` is ``moved`` or ``destination``, below either, or above ``moved``."""
    return _within(other, moved) or _within(other, destination) or _within(moved, other)


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _moved_back_entry(path: str, moved: StoredChange, destination: StoredChange) -> dict[str, Any]:
    """The entry that moves ``path`` back from where the batch moved it, as it left it there."""
    return {
        "path": path,
        "expect_kind": moved.after_kind,
        "expect_hash": moved.after_hash,
        "expect_mode": moved.after_mode,
        "kind": destination.after_kind,
        "moved_from": destination.path,
    }


def _not_undoable(change: StoredChange) -> str:
    """Why the path cannot be put back ("" when it can)."""
    if change.moved_to and change.note:  # (one the batch changed again after moving it)
        return (
            f"moved to {change.moved_to} without its contents ({change.note}), and changed again by the batch "
            "since, so it cannot be moved back"
        )
    return change.note


def _born_in_the_batch(first: dict[str, StoredChange]) -> set[str]:
    """Paths first seen existing below a directory the batch had already made (a file
    moved there with its directory): before the batch they did not exist at all."""
    born: set[str] = set()
    for path, change in first.items():
        if change.kind == "absent":
            continue
        parent = os.path.dirname(path.rstrip(os.sep))
        while parent and parent != os.path.dirname(parent):
            made = first.get(parent)
            if made is not None and made.kind == "absent" and made.index <= change.index:
                born.add(path)
                break
            parent = os.path.dirname(parent)
    return born


def _stale_tree_hashes(changes: list[StoredChange], last: dict[str, StoredChange]) -> set[str]:
    """Directories the batch left as directories whose recorded tree hash a later change
    below them outdated (a file written into a directory an earlier call made): their
    contents are checked against the plan instead. Only a path's last change says what
    the batch left there: a directory made, removed, then a file written in its place
    is a file, whose bytes are checked."""
    stale: set[str] = set()
    for path, change in last.items():
        if change.after_kind != "dir":
            continue
        prefix = path.rstrip(os.sep) + os.sep
        if any(later.index > change.index and later.path.startswith(prefix) for later in changes):
            stale.add(path)
    return stale


def _depth(path: str) -> int:
    return path.rstrip(os.sep).count(os.sep)


def _irreversible(stored: StoredBatch, cannot_reverse: Callable[[str], bool]) -> list[str]:
    """The batch's calls that ran something no pre-image can reverse."""
    found = []
    for call, result in zip(stored.calls, stored.results, strict=True):
        ran = call.started is not None or (result is not None and result.ok)
        if ran and cannot_reverse(call.tool):
            found.append(f"call {call.index} {call.tool}: {call.summary[:120]}")
    return found
