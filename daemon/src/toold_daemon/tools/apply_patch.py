"""apply_patch: an LP1 or ``*** Begin Patch`` patch, all files or none.

Every path is sandbox-checked while planning; every file is read, checked against the
session's reads (StaleFile) and patched in memory before the first write. Only then
are the files written: every new content staged beside its file first (a full disk
fails there, before anything changed), then each put in place with a rename.
"""

from __future__ import annotations

import os
import stat
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, NamedTuple

from msgspec import Meta

from toold_protocol import ToolErrorType

from .. import patches
from ..config import Config
from ..errors import ToolError, from_os_error, limits_exceeded
from ..sandbox.writes import (
    Kept,
    Staged,
    delete,
    discard_staged,
    for_new_contents,
    parent_dir,
    put_back,
    put_in_place,
    read_existing,
    stage,
)
from ._base import RiskLevel, Tool, ToolArgs, ToolContext, ToolOutput
from ._data import ApplyPatchData
from ._mutate import check_fresh, gone, written
from ._text import Text, decode, unified_diff


class ApplyPatchArgs(ToolArgs, frozen=True):
    """Apply a patch to one or more files."""

    patch: Annotated[str, Meta(min_length=1, description="An LP1 patch or a '*** Begin Patch' patch")]


def _patch_failed(path: str, reason: str) -> ToolError:
    where = f"{path}: " if path else ""
    return ToolError(ToolErrorType.PATCH_FAILED, "PATCH_FAILED", f"PatchFailed: {where}{reason}", path=path)


class ApplyPatch(Tool[ApplyPatchArgs]):
    name = "apply_patch"
    description = (
        "Apply a patch in LP1 format or the '*** Begin Patch' format (detected from the first line). "
        "All files change or none do. Files being changed must have been read in this session."
    )
    args_type = ApplyPatchArgs
    side_effecting = True
    risk = "medium"
    data_type = ApplyPatchData
    output = "data: {changes: {path: created|modified|deleted|moved}}"

    def validate(self, args: ApplyPatchArgs) -> None:
        try:
            patches.paths(args.patch)
        except patches.PatchError as exc:
            raise _patch_failed(exc.path, exc.reason) from None

    def paths(self, args: ApplyPatchArgs) -> list[str]:
        return list(dict.fromkeys(patches.paths(args.patch)))

    def risk_for(self, args: ApplyPatchArgs) -> RiskLevel:
        deletes = "*** Delete File:" in args.patch and patches.detect(args.patch) == "begin_patch"
        return "high" if deletes else self.risk

    def summary(self, args: ApplyPatchArgs) -> str:
        files = self.paths(args)
        return f"Patch {len(files)} file(s): {', '.join(files)}"[:200]

    def changes(self, args: ApplyPatchArgs, ctx: ToolContext) -> list[Path]:
        return [ctx.resolve(raw, follow_last=False) for raw in self.paths(args)]

    def preview(self, args: ApplyPatchArgs, ctx: ToolContext) -> str | None:
        def load(raw: str) -> Text | None:
            path = ctx.resolve(raw)
            try:
                with parent_dir(ctx.sandbox, path, shown=raw) as (dir_fd, name):
                    existing = read_existing(dir_fd, name, shown=raw, sandbox=ctx.sandbox)
            except ToolError as exc:
                if exc.type == ToolErrorType.FILE_NOT_FOUND:
                    return None
                raise
            return None if existing is None else decode(existing.data, raw)

        diffs = []
        for change in patches.apply(args.patch, load):
            before = change.before.body if change.before else ""
            after = change.after.body if change.after else ""
            diffs.append(unified_diff(before, after, change.move_to or change.path))
        return "".join(diffs)

    def precheck(self, args: ApplyPatchArgs, resolved: dict[str, Path], config: Config) -> None:
        _check_size(args, config)

    def run(self, args: ApplyPatchArgs, ctx: ToolContext) -> ToolOutput:
        _check_size(args, ctx.config)
        with ExitStack() as stack:
            dirs: dict[str, tuple[Path, int, str]] = {}
            for raw in self.paths(args):
                path = ctx.resolve(raw)
                try:
                    dir_fd, name = stack.enter_context(parent_dir(ctx.sandbox, path, shown=raw))
                except ToolError as exc:
                    if exc.type != ToolErrorType.FILE_NOT_FOUND:
                        raise
                    # The parent directory does not exist yet: created at write time, only
                    # once the whole patch is known to apply (a failed patch leaves no trace).
                    dir_fd, name = -1, path.name
                dirs[raw] = (path, dir_fd, name)
            originals: dict[str, bytes] = {}

            def load(raw: str) -> Text | None:
                _, dir_fd, name = dirs[raw]
                if dir_fd < 0:
                    return None
                existing = read_existing(dir_fd, name, shown=raw, sandbox=ctx.sandbox)
                if existing is None:
                    return None
                originals[raw] = existing.data
                return decode(existing.data, raw)

            try:
                changes = patches.apply(args.patch, load)
            except patches.PatchError as exc:
                raise _patch_failed(exc.path, exc.reason) from None
            except ToolError as exc:
                raise _patch_failed(str(exc.details.get("path", "")), exc.message) from None
            for change in changes:
                if change.action != "add":
                    path, dir_fd, name = dirs[change.path]
                    check_fresh(ctx, path, originals[change.path], dir_fd=dir_fd, name=name, shown=change.path)
                if change.move_to and change.move_to != change.path:
                    _, dst_fd, dst_name = dirs[change.move_to]
                    # (dst_fd < 0: its directory does not exist yet, so neither does the file)
                    existing = (
                        read_existing(dst_fd, dst_name, shown=change.move_to, sandbox=ctx.sandbox)
                        if dst_fd >= 0
                        else None
                    )
                    if existing is not None:
                        raise _patch_failed(change.move_to, "Move to a file that exists")
            if not changes:
                raise _patch_failed("", "the patch has no file operations")
            if all(_unchanged(change) for change in changes):
                return ToolOutput("No changes applied.", "No changes applied.", {"changes": {}})
            for raw, (path, dir_fd, _) in list(dirs.items()):
                if dir_fd < 0:
                    dirs[raw] = (path, *stack.enter_context(parent_dir(ctx.sandbox, path, create=True, shown=raw)))
            return self._write(changes, dirs, originals)

    def _write(
        self, changes: list[patches.FileChange], dirs: dict[str, tuple[Path, int, str]], originals: dict[str, bytes]
    ) -> ToolOutput:
        """Every new content is staged beside its file first: that is where a full disk
        fails, and then nothing has changed. Only then are the files put in place and the
        deleted ones removed, steps that need no room; one of those failing (an I/O error,
        a directory made read-only meanwhile) puts back what the steps before it changed."""
        staged = _stage(changes, dirs)
        records: dict[str, str] = {}
        summary: dict[str, str] = {}
        diffs: list[str] = []
        done: list[_Step] = []  # what each step replaced, to put back if a later one fails
        try:
            for index, change in enumerate(changes):
                path, dir_fd, name = dirs[change.path]
                if change.after is None:
                    replaced = (originals[change.path], _mode_of(dir_fd, name, change.path))
                    delete(dir_fd, name, recursive=False, shown=change.path, prefix=change.path)
                    done.append(_Step(dir_fd, name, change.path, replaced))
                    records |= gone(path)
                    summary[change.path] = "deleted"
                    diffs.append(unified_diff(change.before.body if change.before else "", "", change.path))
                    continue
                target = change.move_to or change.path
                target_path, target_fd, target_name = dirs[target]
                old = originals.get(target) if target == change.path else None  # (a move's target is new)
                kept: Kept = None if old is None else (old, _mode_of(target_fd, target_name, target))
                _, new_file, data = staged.pop(index)
                put_in_place(target_fd, new_file, target_name, shown=target)
                done.append(_Step(target_fd, target_name, target, kept))
                if target != change.path:
                    replaced = (originals[change.path], _mode_of(dir_fd, name, change.path))
                    delete(dir_fd, name, recursive=False, shown=change.path, prefix=change.path)
                    done.append(_Step(dir_fd, name, change.path, replaced))
                    records |= gone(path) | written(target_path, data)
                    summary[change.path], summary[target] = "deleted", "moved"
                else:
                    records |= written(path, data)
                    summary[target] = "created" if change.action == "add" else "modified"
                before = change.before.body if change.before else ""
                diffs.append(unified_diff(before, change.after.body, target))
        except ToolError as exc:
            _discard(staged)
            raise _put_back(done, exc) from None
        diff = "".join(diffs)
        listing = "\n".join(f"{kind} {path}" for path, kind in summary.items())
        return ToolOutput(f"Patch applied:\n{listing}\n{diff}", diff or listing, {"changes": summary}, records=records)


class _Step(NamedTuple):
    """What one step of a patch's writing replaced at ``name``."""

    dir_fd: int
    name: str
    shown: str
    replaced: Kept


#: By a change's index: its target's directory, the file staged there, the bytes in it.
_Staged = dict[int, tuple[int, Staged, bytes]]


def _stage(changes: list[patches.FileChange], dirs: dict[str, tuple[Path, int, str]]) -> _Staged:
    """Each change's new content in a temp file beside its target; on any failure every
    one staged so far is removed, and nothing else has changed."""
    staged: _Staged = {}
    try:
        for index, change in enumerate(changes):
            if change.after is None:
                continue
            _, dir_fd, name = dirs[change.path]
            mode = for_new_contents(_mode_of(dir_fd, name, change.path)) if change.action == "update" else None
            target = change.move_to or change.path
            _, target_fd, target_name = dirs[target]
            data = change.after.encode()
            like = (dir_fd, name) if change.action == "update" else None  # a moved file keeps its own
            staged[index] = (target_fd, stage(target_fd, target_name, data, mode=mode, shown=target, like=like), data)
    except BaseException:
        _discard(staged)
        raise
    return staged


def _discard(staged: _Staged) -> None:
    for dir_fd, new_file, _ in staged.values():
        discard_staged(dir_fd, new_file)


def _put_back(done: list[_Step], failure: ToolError) -> ToolError:
    """Undo the steps taken, last first; the error to report: ``failure``, and what could
    not be put back if anything could not (the patch then stands in part, and says so)."""
    left = [step.shown for step in reversed(done) if not put_back(step.dir_fd, step.name, step.replaced)]
    if not left:
        return failure
    return ToolError(
        failure.type,
        failure.code,
        f"{failure.message}; the patch is applied in part: {', '.join(left)} could not be put back as it was",
        **failure.details,
        not_put_back=left,
    )


def _unchanged(change: patches.FileChange) -> bool:
    """An update whose hunks leave the file as it was, and that moves nothing."""
    return (
        change.action == "update"
        and change.before is not None
        and change.after is not None
        and change.before.encode() == change.after.encode()
        and (change.move_to is None or change.move_to == change.path)
    )


def _mode_of(dir_fd: int, name: str, shown: str) -> int:
    try:
        return stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError as exc:
        raise from_os_error(exc, shown) from None


__all__ = ["ApplyPatch"]


def _check_size(args: ApplyPatchArgs, config: Config) -> None:
    limit = config.tools.apply_patch.max_patch_bytes
    if len(args.patch.encode()) > limit:
        raise limits_exceeded(f"the patch is over max_patch_bytes ({limit})", limit=limit)
