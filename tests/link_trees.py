"""Trees of directories, files and symbolic links drawn by hypothesis, for checking path
canonicalisation against ``os.path.realpath``."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import strategies as st

NAMES = ["a", "b", "c"]

#: Entries to make: (where, as names below the base; what: "dir", "file", "link" (its
#: target relative, ".." allowed) or "outside link" (its target below another directory);
#: the target's names).
Entries = list[tuple[list[str], str, list[str]]]


def entries(kinds: tuple[str, ...] = ("dir", "file", "link")) -> st.SearchStrategy[Entries]:
    return st.lists(
        st.tuples(
            st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
            st.sampled_from(kinds),
            st.lists(st.sampled_from([*NAMES, ".."]), min_size=1, max_size=3),
        ),
        max_size=8,
    )


def make_tree(base: str, drawn: Entries, outside: str = "/nonexistent") -> None:
    """Make what ``drawn`` names below ``base``, as far as it can be made, and only there:
    an entry whose place lies through a link made before (``a -> ..``, then ``a/c``) is
    left out. Made, it landed beside ``base`` in pytest's temporary root, and a link loop
    there (``c -> c``) made pytest fail at the end of the session."""
    real_base = os.path.realpath(base)
    for where, kind, target in drawn:
        path = os.path.join(base, *where)
        parent = os.path.realpath(os.path.dirname(path))
        if not (parent == real_base or parent.startswith(real_base + os.sep)) or os.path.lexists(path):
            continue
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if kind == "dir":
                os.makedirs(path, exist_ok=True)
            elif kind == "file":
                Path(path).touch()
            elif kind == "link":
                os.symlink(os.path.join(*target), path)
            else:
                os.symlink(os.path.join(outside, *target), path)
        except OSError:
            pass  # the place is taken: the tree is what it is
