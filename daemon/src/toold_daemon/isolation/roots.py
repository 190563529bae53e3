"""Which directories a set of roots are, beyond their names."""

from __future__ import annotations

import os


def roots_identity(roots: list[str]) -> tuple[tuple[int, int], ...]:
    """(device, inode) of each root, or (-1, -1) for one that is gone. Landlock's rules and
    the mount views hold the directories the zygote started with; a root removed and
    made again under the same name is another directory, which its commands could not
    use."""
    found = []
    for root in roots:
        try:
            st = os.stat(root)
            found.append((st.st_dev, st.st_ino))
        except OSError:
            found.append((-1, -1))
    return tuple(found)
