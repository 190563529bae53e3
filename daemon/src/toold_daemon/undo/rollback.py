"""What an undo changed so far, kept to put back if a later step fails (``Rollback``),
and the names of the trees it sets aside meanwhile."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from toold_protocol import ToolErrorType

from ..errors import ToolError
from ..sandbox.writes import WHOLE_READ_MAX_BYTES, atomic_write, clipped, delete, move, parent_dir
from ..tools._base import ToolContext
from .images import Image, image_of


class Rollback:
    """What the undo changed so far, to put back if a later step fails: each path's state
    before the undo touched it (bytes of files and symlinks, in memory; a large file, a
    second name for it beside it), and the trees it took away, set aside under a
    temporary name beside them until the undo completes."""

    def __init__(self, ctx: ToolContext, token: str) -> None:
        self.ctx = ctx
        self.prefix = f"{ASIDE_PREFIX}{token}-"
        self.before: list[tuple[str, Image]] = []  # (path shown, its state before)
        self.aside: list[tuple[str, str]] = []  # (path shown, its temporary name's path)
        self.linked: list[tuple[str, str]] = []  # large files: (path shown, a second name's path)
        #: trees moved back, (where to, where from): moved where the batch left them again
        self.moved: list[tuple[str, str]] = []

    def remember(self, shown: str) -> None:
        """Keep ``shown``'s state before the undo changes it."""
        path = self.ctx.resolve(shown, follow_last=False)
        if _is_dir(path):
            self.before.append((shown, Image(path=str(path), kind="dir")))
        elif not self._linked_aside(shown, path):
            self.before.append((shown, image_of(str(path))))

    def _linked_aside(self, shown: str, path: Path) -> bool:
        """A file too large to hold in memory (a 5 GB one failed with MemoryError) gets a
        second name beside it instead, which a rollback renames back over the path."""
        try:
            if not stat.S_ISREG((st := os.lstat(path)).st_mode) or st.st_size <= WHOLE_READ_MAX_BYTES:
                return False
            with parent_dir(self.ctx.sandbox, path, shown=shown) as (dir_fd, name):
                aside = clipped(f"{self.prefix}{len(self.aside) + len(self.linked)}-{name}", 200)
                os.link(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return False  # (a filesystem without hard links: held in memory, as far as it goes)
        self.linked.append((shown, os.path.join(os.path.dirname(shown), aside) if "/" in shown else aside))
        return True

    def moved_back(self, shown: str, moved_from: str) -> None:
        """``moved_from`` was moved back to ``shown`` (nothing else of either is remembered)."""
        self.moved.append((shown, moved_from))

    def set_aside(self, dir_fd: int, name: str, shown: str) -> None:
        """Move a tree out of the way (one rename) instead of removing it yet."""
        aside = clipped(f"{self.prefix}{len(self.aside)}-{name}", 200)
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        self.aside.append((shown, os.path.join(os.path.dirname(shown), aside) if "/" in shown else aside))

    def holds_only_set_aside(self, dir_fd: int, name: str) -> bool:
        """Whether directory ``name`` is empty but for trees this undo set aside in it."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return False
        try:
            entries = os.listdir(fd)
        finally:
            os.close(fd)
        return bool(entries) and all(entry.startswith(self.prefix) for entry in entries)

    def commit(self) -> None:
        """Remove the trees set aside, outermost first (one set aside inside another goes
        with it), and the second names of large files."""
        for _shown, aside in [*reversed(self.aside), *self.linked]:
            try:
                path = self.ctx.resolve(aside, follow_last=False)
                with parent_dir(self.ctx.sandbox, path, shown=aside) as (dir_fd, name):
                    delete(dir_fd, name, recursive=True, shown=aside, prefix=aside)
            except ToolError as exc:
                if exc.type != ToolErrorType.FILE_NOT_FOUND:
                    raise

    def back(self) -> list[str]:
        """Put every touched path back as it was before the undo; the paths that could not be."""
        # The trees set aside first, outermost first (one may hold another); a directory
        # that existed before the undo was only ever set aside, so it is back after this.
        left = self._renamed_back(self.aside)
        for shown, image in reversed(self.before):
            if image.kind == "dir":
                continue
            try:
                self._restore(shown, image)
            except (OSError, ToolError):
                left.append(shown)
        left += self._renamed_back(self.linked)
        for shown, moved_from in reversed(self.moved):  # last: where they go back to is as it was again
            try:
                move_by_name(self.ctx, shown, moved_from)
            except (OSError, ToolError):
                left.append(moved_from)
        return left

    def _renamed_back(self, names: list[tuple[str, str]]) -> list[str]:
        """Each (path shown, its other name) renamed back, last first; those that could not be."""
        left = []
        for shown, aside in reversed(names):
            try:
                src = self.ctx.resolve(aside, follow_last=False)
                with parent_dir(self.ctx.sandbox, src, shown=aside) as (dir_fd, name):
                    os.rename(name, os.path.basename(shown), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except (OSError, ToolError):
                left.append(shown)
        return left

    def _restore(self, shown: str, image: Image) -> None:
        path = self.ctx.resolve(shown, follow_last=False)
        if image.kind == "absent" and not os.path.lexists(path):
            return  # (making its parents to find nothing there would block a tree moved back)
        with parent_dir(self.ctx.sandbox, path, create=True, shown=shown) as (dir_fd, name):
            current = lstat_at(dir_fd, name)
            if current is not None and stat.S_ISDIR(current.st_mode):
                delete(dir_fd, name, recursive=True, shown=shown, prefix=shown)
                current = None
            if image.kind == "absent":
                if current is not None:
                    os.unlink(name, dir_fd=dir_fd)
            elif image.kind == "symlink":
                if current is not None:
                    os.unlink(name, dir_fd=dir_fd)
                os.symlink(image.data, name, dir_fd=dir_fd)
            elif image.kind == "file":
                attributes = (image.uid, image.gid, image.xattrs)
                atomic_write(dir_fd, name, image.data, mode=image.mode, shown=shown, attributes=attributes)


ASIDE_PREFIX = ".toold-undo-"


def aside_token(undoes: str) -> str:
    """The mark of one batch's undo in the names of the trees it sets aside: the same in
    a run the crash cut short and in the run that finishes it."""
    return hashlib.sha256(undoes.encode()).hexdigest()[:12]


def move_by_name(ctx: ToolContext, source: str, destination: str) -> None:
    """Move ``source`` to ``destination`` (which must not exist), as ``move_file`` does:
    one rename, or across filesystems a copy and a delete."""
    with (
        parent_dir(ctx.sandbox, ctx.resolve(source, follow_last=False), shown=source) as (src_fd, src_name),
        parent_dir(ctx.sandbox, ctx.resolve(destination, follow_last=False), create=True, shown=destination) as (
            dst_fd,
            dst_name,
        ),
    ):
        move(
            src_fd,
            src_name,
            dst_fd,
            dst_name,
            overwrite=False,
            shown_src=source,
            shown_dst=destination,
            sandbox=ctx.sandbox,
        )


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
