"""``restore_files``: what ``toolctl undo`` runs, in the user's worker, as the user.

Its arguments name each path, the state the undone batch left it in (``expect``) and
the state to put back; the bytes come from the daemon's undo store with the call
(``ToolContext.blobs``), never from the arguments. First every path is compared with
what the batch left: one that changed since is a conflict, and without ``force``
nothing at all is restored. Then each path is put back in order, through the same
symlink-refusing walk from the root as every write. The daemon offers this tool to no
model: it is not listed, and only an undo request builds its calls.

An undo cut short by a crash is finished at the daemon's next start (``resume``): a
path already in the state the undo puts back is done; one still as the batch left it is
put back; trees the undo had set aside (``.toold-undo-<token>-…``, the token stable for
the undone batch) and temporary files of a write cut short are removed. A path in
neither state was changed by someone in between: then nothing more is restored and the
result names what was and what was not.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from toold_protocol import ToolErrorType

from ..errors import ToolError, bad_args, limits_exceeded
from ..sandbox.attributes import give_attributes
from ..sandbox.paths import remembering_missing
from ..sandbox.trees import walk
from ..sandbox.writes import (
    atomic_write,
    delete,
    parent_dir,
    set_mode,
    temp_prefix,
)
from ..tools._base import Tool, ToolArgs, ToolContext, ToolOutput
from .images import IDENTITY_TREE, Kind, image_of, state_and_mode_of
from .rollback import ASIDE_PREFIX, Rollback, aside_token, lstat_at, move_by_name


class Entry(ToolArgs, frozen=True):
    path: str
    expect_kind: Kind  # what the undone batch left there
    kind: Kind  # what to put back
    expect_hash: str = ""
    expect_mode: int = -1  # its permission bits as the batch left them (-1: not compared)
    mode: int = 0
    uid: int = -1  # the owner to give back (-1: none recorded: a write's own rule applies)
    gid: int = -1  # the group to give back (-1: as for the owner)
    xattrs: dict[str, bytes] = msgspec.field(default_factory=dict)  # extended attributes to give back
    hash: str = ""
    note: str = ""  # why it cannot be put back ("" when it can)
    #: Put back by moving it back from there (where the batch moved it whole, without
    #: keeping its contents); that path has its own entry, checked like any other.
    moved_from: str = ""


class RestoreArgs(ToolArgs, frozen=True):
    undoes: Annotated[str, Meta(max_length=256)]
    entries: list[Entry]
    force: bool = False
    irreversible: tuple[str, ...] = ()  # the undone batch's calls nothing can reverse (commands)
    resume: bool = False  # finishing an undo a crash cut short (the daemon's start sets it)


#: The most path components an undo may name in all (10,000 paths 20 deep).
MAX_PATH_COMPONENTS = 200_000


class RestoreFiles(Tool[RestoreArgs]):
    name = "restore_files"
    description = "Put back the files a batch changed (toolctl undo builds these calls)."
    args_type = RestoreArgs
    side_effecting = True
    follows_last_symlink = False
    risk = "medium"
    internal: ClassVar[bool] = True
    timeout_kind = "undo"
    #: Its calls are built by the daemon from its journal, not sent by a client: one entry
    #: per path a batch changed (up to 10,000 below one directory), each with its path,
    #: hashes and attributes. The client's bound (256 KiB) refused the undo of a deleted
    #: tree of 2,000 files; this one keeps the call, with the saved contents it takes to
    #: the worker, within a worker's frame.
    max_args_bytes: ClassVar[int | None] = 16 << 20
    output = "data: {undoes, restored, conflicts, not_undoable, irreversible, forced, resumed, already_restored}"

    def paths(self, args: RestoreArgs) -> list[str]:
        return [entry.path for entry in args.entries if not entry.note]  # the others are only reported

    def summary(self, args: RestoreArgs) -> str:
        forced = " (forced)" if args.force else ""
        return f"Undo batch {args.undoes[:80]}: restore {len(args.entries)} path(s){forced}"

    def validate(self, args: RestoreArgs) -> None:
        """Refuse, before anything is looked at, an undo whose paths are too deep to reach
        by name in time: each step names its path whole, and the kernel and the checks
        walk it a component at a time, so a tree nested 1,300 deep (845,000 components in
        its 1,300 paths) ran past the call's time limit."""
        planned = {entry.path for entry in args.entries if not entry.note}
        if any(entry.moved_from and entry.moved_from not in planned for entry in args.entries):
            raise bad_args("a path to move back from must have an entry of its own")
        components = sum(entry.path.count("/") + 1 for entry in args.entries)
        if components > MAX_PATH_COMPONENTS:
            raise limits_exceeded(
                f"this undo names {len(args.entries)} paths of {components} path components in all (a tree nested "
                f"{max(entry.path.count('/') + 1 for entry in args.entries)} deep), over the "
                f"{MAX_PATH_COMPONENTS} it may walk; nothing was changed",
                limit=MAX_PATH_COMPONENTS,
                components=components,
            )

    def changes(self, args: RestoreArgs, ctx: ToolContext) -> list[Path]:
        with remembering_missing():
            return [ctx.resolve(entry.path, follow_last=False) for entry in args.entries if not entry.note]

    def moves(self, args: RestoreArgs, ctx: ToolContext) -> dict[Path, Path]:
        """The trees it moves back: an undo of this undo moves them again, unread."""
        with remembering_missing():
            return {
                ctx.resolve(entry.moved_from, follow_last=False): ctx.resolve(entry.path, follow_last=False)
                for entry in args.entries
                if entry.moved_from and not entry.note
            }

    def run(self, args: RestoreArgs, ctx: ToolContext) -> ToolOutput:
        token = aside_token(args.undoes)
        usable = [entry for entry in args.entries if not entry.note]
        already: list[str] = []
        if args.resume:
            _clear_leftovers(usable, ctx, token)
            already = [entry.path for entry in usable if _put_back_already(entry, ctx)]
            usable = [entry for entry in usable if entry.path not in already]
        if not args.force and not args.resume:  # (a resumed undo passed this before it began)
            _refuse_to_take_away_the_only_copies(args, usable)
        planned = {entry.path.rstrip("/") for entry in usable} | {path.rstrip("/") for path in already}
        with remembering_missing():  # (the checks change nothing)
            conflicts = [
                entry.path
                for entry in usable
                if _changed_since(entry, ctx) and not (args.resume and _midway(entry, ctx, planned))
            ]
            conflicts += _unplanned_contents(usable, ctx)
        if conflicts and not args.force:
            done = f"{len(already)} path(s) were put back before the daemon stopped; " if args.resume else ""
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "UNDO_CONFLICT",
                f"{len(conflicts)} path(s) changed since batch {args.undoes} ({done}nothing {'more ' * args.resume}"
                f"was restored; --force restores anyway): {', '.join(conflicts[:20])}",
                conflicts=conflicts,
                already_restored=already,
            )
        restored: list[str] = []
        undo = Rollback(ctx, token)
        try:
            for entry in usable:  # in the plan's order: removals deepest first, then outermost first
                ctx.check_cancelled()
                if not entry.moved_from:  # (what moves back is remembered once moved)
                    undo.remember(entry.path)
                _put_back(entry, ctx, undo)
                restored.append(entry.path)
        except BaseException as exc:
            left = undo.back()
            if isinstance(exc, ToolError):
                why = exc.message
            elif isinstance(exc, OSError):
                why = f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or 'a path'})"
            else:
                raise
            state = "nothing was changed" if not left else f"could not put back: {', '.join(left[:20])}"
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "UNDO_FAILED",
                f"undoing batch {args.undoes} failed after {len(restored)} of {len(usable)} path(s) ({why}); "
                f"every path it had changed was put back as it was, so {state}",
                restored_before_failure=restored,
                not_rolled_back=left,
            ) from None
        undo.commit()
        not_undoable = [f"{entry.path} ({entry.note})" for entry in args.entries if entry.note]
        lines = [f"Restored {len(restored)} path(s) changed by batch {args.undoes}."]
        if args.resume:
            lines[0] = (
                f"Finished undoing batch {args.undoes} after the daemon restarted: {len(already)} path(s) "
                f"had been put back before it stopped, {len(restored)} now."
            )
        if conflicts:
            lines.append(f"Forced over {len(conflicts)} path(s) changed since: {', '.join(conflicts[:20])}")
        if not_undoable:
            lines.append(f"Not undoable: {'; '.join(not_undoable[:20])}")
        if args.irreversible:
            lines.append(f"Could not reverse (commands): {'; '.join(args.irreversible[:20])}")
        data: dict[str, Any] = {
            "undoes": args.undoes,
            "restored": restored,
            "conflicts": conflicts,
            "not_undoable": not_undoable,
            "irreversible": list(args.irreversible),
            "forced": args.force,
            "resumed": args.resume,
            "already_restored": already,
        }
        return ToolOutput("\n".join(lines), data=data)


def _refuse_to_take_away_the_only_copies(args: RestoreArgs, usable: list[Entry]) -> None:
    """Refuse an undo that cannot put back some paths and would take away paths the batch
    made. A moved tree larger than the undo bound is the case: the files past the bound
    have no saved contents, and their only copy is where the batch moved them, which
    the undo takes away. Putting back the rest, an undo destroyed those files."""
    cannot = [f"{entry.path} ({entry.note})" for entry in args.entries if entry.note]
    moving = _moving_back(usable)
    taken = [
        entry.path
        for entry in usable
        if entry.kind == "absent" and entry.expect_kind != "absent" and not _inside_any(entry.path, moving)
    ]
    if not cannot or not taken:
        return
    raise ToolError(
        ToolErrorType.EXECUTION_FAILED,
        "UNDO_INCOMPLETE",
        f"{len(cannot)} path(s) of batch {args.undoes} cannot be put back ({'; '.join(cannot[:10])}), and "
        f"undoing the rest would take away {len(taken)} path(s) the batch made ({', '.join(taken[:10])}), "
        "which may hold the only copy of them (a moved file); nothing was restored; --force undoes the rest anyway",
        not_undoable=cannot,
        would_take_away=taken,
    )


def _moving_back(entries: list[Entry]) -> set[str]:
    """The paths trees are moved back from."""
    return {entry.moved_from for entry in entries if entry.moved_from}


def _inside_any(path: str, tops: set[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)


def _unplanned_contents(entries: list[Entry], ctx: ToolContext) -> list[str]:
    """Entries now inside a directory the batch made (and the undo takes away) that the
    plan does not account for, where no tree hash could tell: someone else's files,
    which must not be removed unasked."""
    removed = {entry.path for entry in entries if entry.kind == "absent"}
    trees = [entry.path + "/" for entry in entries if entry.kind == "absent" and entry.expect_hash]
    moving = _moving_back(entries)  # (what is in a tree moved back goes with it)
    found: list[str] = []
    for entry in entries:
        if entry.kind != "absent" or entry.expect_kind != "dir" or entry.expect_hash or entry.path in moving:
            continue
        try:
            names = os.listdir(ctx.resolve(entry.path, follow_last=False))
        except OSError:
            continue
        for name in names:
            child = f"{entry.path.rstrip('/')}/{name}"
            if child not in removed and not any(child.startswith(t) for t in trees):
                found.append(child)
    return found


def _changed_since(entry: Entry, ctx: ToolContext) -> bool:
    """Whether the path is no longer as the undone batch left it: another kind, other
    contents, other permission bits (a directory: anything below it too, when the
    batch's record has its tree's hash)."""
    path = str(ctx.resolve(entry.path, follow_last=False))
    by_identity = entry.expect_hash.startswith(IDENTITY_TREE)  # (a tree moved whole)
    kind, digest, mode = state_and_mode_of(path, tree=bool(entry.expect_hash), by_identity=by_identity)
    if kind != entry.expect_kind:
        return True
    if entry.expect_mode >= 0 and mode >= 0 and mode != entry.expect_mode:
        return True
    if kind == "dir":
        return bool(entry.expect_hash) and digest != entry.expect_hash
    return digest != entry.expect_hash


def _put_back_already(entry: Entry, ctx: ToolContext) -> bool:
    """Whether the path is already in the state the undo puts back."""
    path = str(ctx.resolve(entry.path, follow_last=False))
    if entry.moved_from:  # (moved back: there again, and gone from where it was moved)
        moved_from = str(ctx.resolve(entry.moved_from, follow_last=False))
        return image_of(path, attributes=False).kind == entry.kind and not os.path.lexists(moved_from)
    kind, digest, _mode = state_and_mode_of(path, tree=False)
    if kind != entry.kind:
        return False
    if kind in ("file", "dir"):
        try:
            if stat.S_IMODE(os.lstat(path).st_mode) != entry.mode:
                return False
        except OSError:
            return False
    return kind in ("absent", "dir") or digest == entry.hash


def _midway(entry: Entry, ctx: ToolContext, planned: set[str]) -> bool:
    """Whether the path is as putting it back leaves it between two steps: removed before
    its old self is made again, a directory made before its mode is set, or a directory
    the batch made whose contents the undo had begun to take away (deepest first) and
    that holds nothing the plan does not account for."""
    path = str(ctx.resolve(entry.path, follow_last=False))
    kind, _digest, _mode = state_and_mode_of(path, tree=False)
    if kind == "absent" or kind == entry.kind == "dir":
        return True
    return entry.kind == "absent" and kind == entry.expect_kind == "dir" and _holds_only(path, entry.path, planned)


def _holds_only(path: str, shown: str, planned: set[str]) -> bool:
    """Whether everything below directory ``path`` (shown as ``shown``) is in ``planned``."""
    top = shown.rstrip("/")
    unreadable: list[OSError] = []
    for parent, dirs, files in walk(path, onerror=unreadable.append):  # symlinks are listed, never followed
        below = os.path.relpath(parent, path)
        base = top if below == "." else f"{top}/{below}"
        if any(f"{base}/{name}" not in planned for name in (*dirs, *files)):
            return False
    return not unreadable  # what cannot be listed cannot be said to be planned


def _clear_leftovers(entries: list[Entry], ctx: ToolContext, token: str) -> None:
    """Remove what a run cut short left beside the entries: trees it had set aside (its
    token in their names) and temporary files of a write in progress."""
    prefix = f"{ASIDE_PREFIX}{token}-"
    parents = {os.path.dirname(entry.path.rstrip("/")) for entry in entries}
    names = {entry.path: os.path.basename(entry.path.rstrip("/")) for entry in entries}
    for parent in sorted(parents, key=len, reverse=True):
        shown_parent = parent or "."
        try:
            listing = os.listdir(ctx.resolve(shown_parent, follow_last=False))
        except OSError:
            continue
        temps = {temp_prefix(names[p]) for p in names if os.path.dirname(p.rstrip("/")) == parent}
        for name in listing:
            is_temp = name.endswith(".tmp") and any(name.startswith(t) for t in temps)
            if not (name.startswith(prefix) or is_temp):
                continue
            shown = f"{parent}/{name}" if parent else name
            try:
                with parent_dir(ctx.sandbox, ctx.resolve(shown, follow_last=False), shown=shown) as (dir_fd, leaf):
                    delete(dir_fd, leaf, recursive=True, shown=shown, prefix=shown)
            except ToolError as exc:
                if exc.type != ToolErrorType.FILE_NOT_FOUND:
                    raise


def _put_back(entry: Entry, ctx: ToolContext, undo: Rollback) -> None:
    if entry.moved_from:
        move_by_name(ctx, entry.moved_from, entry.path)
        undo.moved_back(entry.path, entry.moved_from)
        return
    path = ctx.resolve(entry.path, follow_last=False)
    if entry.kind == "absent" and image_of(str(path), attributes=False).kind == "absent":
        # Nothing to take away; and its parent may be a file now (a directory the batch
        # deleted, then wrote a file in its place), where no directory is to be made.
        return
    with parent_dir(ctx.sandbox, path, create=True, shown=entry.path) as (dir_fd, name):
        current = lstat_at(dir_fd, name)
        if entry.kind == "absent":
            # a directory the batch made goes with what is in it: it was checked to be as
            # the batch left it (or --force said to take it anyway); set aside until the
            # whole undo has succeeded
            is_dir = current is not None and stat.S_ISDIR(current.st_mode)
            made_tree = entry.expect_kind == "dir" and bool(entry.expect_hash)
            if is_dir and (made_tree or undo.holds_only_set_aside(dir_fd, name)):
                undo.set_aside(dir_fd, name, entry.path)
                return
            _remove(dir_fd, name, current)
        elif entry.kind == "dir":
            if current is not None and not stat.S_ISDIR(current.st_mode):
                os.unlink(name, dir_fd=dir_fd)
                current = None
            if current is None:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                # (before the mode: a new owner or group clears setuid and setgid bits)
                give_attributes(fd, (entry.uid, entry.gid, entry.xattrs))
                if stat.S_IMODE(os.fstat(fd).st_mode) != entry.mode:  # (what is right is left alone)
                    set_mode(fd, entry.mode)
            finally:
                os.close(fd)
        elif entry.kind == "symlink":
            _remove(dir_fd, name, current)
            os.symlink(_blob(entry, ctx), name, dir_fd=dir_fd)
        else:
            if current is not None and stat.S_ISDIR(current.st_mode):
                _remove(dir_fd, name, current)
            recorded = entry.uid >= 0 or entry.gid >= 0  # (else an older record: a write's own rule)
            attributes = (entry.uid, entry.gid, entry.xattrs) if recorded else None
            atomic_write(dir_fd, name, _blob(entry, ctx), mode=entry.mode, shown=entry.path, attributes=attributes)


def _blob(entry: Entry, ctx: ToolContext) -> bytes:
    data = ctx.blobs.get(entry.hash)
    if data is None:
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED, "UNDO_DATA_MISSING", f"the saved content of {entry.path} is gone"
        )
    return data


def _remove(dir_fd: int, name: str, current: os.stat_result | None) -> None:
    """Remove a file or symlink; a directory only when empty (its entries come first)."""
    if current is None:
        return
    if stat.S_ISDIR(current.st_mode):
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            raise ToolError(
                ToolErrorType.EXECUTION_FAILED,
                "UNDO_DIR_NOT_EMPTY",
                f"{name} was created by the batch and now holds other files: {exc.strerror}",
            ) from None
    else:
        os.unlink(name, dir_fd=dir_fd)
