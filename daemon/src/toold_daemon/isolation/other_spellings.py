"""Whether a view a zygote mounted over an entry holds for the entry's other spellings.

A mount covers a name. Where the kernel itself folds case (ext4 or tmpfs ``casefold``,
vfat), every spelling of a name finds the same directory entry, and so the mount. On a
FUSE file system that folds case (a FAT or exFAT disk through FUSE, a host folder some
FUSE server shares), another spelling is another entry of the same file, past the mount:
``cat .ENV`` reads the ``.env`` the stand-in covers. Every spelling cannot be covered;
the zygote tries one (the name with its case swapped) and reports its layer partial
where that one reaches the entry itself rather than the view over it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..sandbox import long_paths

Identity = os.stat_result


def identities(paths: Iterable[str]) -> dict[str, Identity]:
    """What each path that exists is, taken before a view covers it."""
    found: dict[str, Identity] = {}
    for path in paths:
        try:
            found[path] = long_paths.lstat(path)
        except OSError:
            continue
    return found


def _same_entry(a: os.stat_result, b: os.stat_result) -> bool:
    """The same file or directory: by inode, or where a FUSE server numbers each lookup
    anew (fusefat does), by device, type, size and modification time."""
    if a.st_dev != b.st_dev:
        return False  # one is a view (``/dev/null``, an empty tmpfs)
    if a.st_ino == b.st_ino:
        return True
    return (a.st_mode, a.st_size, a.st_mtime_ns) == (b.st_mode, b.st_size, b.st_mtime_ns)


def reached_by_other_spelling(before: dict[str, Identity]) -> list[str]:
    """The other spellings that, now the views are mounted, still reach an entry of
    ``before`` itself."""
    reached: list[str] = []
    for path, identity in before.items():
        directory, name = os.path.split(path)
        other = name.swapcase()
        if other == name:
            continue
        spelled = os.path.join(directory, other)
        try:
            st = os.stat(spelled, follow_symlinks=False)
        except OSError:
            continue
        if _same_entry(st, identity):
            reached.append(spelled)
    return reached


def partial_because_folded(reached: list[str], what: str) -> str:
    """The layer's report when ``reached`` is not empty."""
    return (
        f"partial: the disk folds case past the mounts: {len(reached)} {what} reached by another "
        f"spelling (such as {reached[0]})"
    )
