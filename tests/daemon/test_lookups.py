"""Lookups on the event loop come from the kernel's caches, or say they would wait."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.folding_disk import fat_disk
from toold_daemon.sandbox.lookups import WouldBlock, from_the_caches_alone, lexists, open_path
from toold_daemon.sandbox.named import denied_words
from toold_daemon.sandbox.paths import Sandbox


def test_a_cached_path_is_looked_up_on_the_loop(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("x")
    with from_the_caches_alone():
        os.close(open_path(str(tmp_path / "a" / "f.txt")))
        assert lexists(str(tmp_path / "a" / "f.txt"))
        assert Sandbox([tmp_path]).canonical(str(tmp_path / "a" / "f.txt")) == str(tmp_path / "a" / "f.txt")


def test_a_name_never_looked_up_on_a_local_disk_is_looked_up_there(tmp_path: Path) -> None:
    """A new file's name, a command's word: the kernel has no entry for it yet, and one
    real lookup in a cached directory of a local disk answers (no thread needed)."""
    (tmp_path / "a").mkdir()
    sandbox = Sandbox([tmp_path])
    name = f"never-looked-up-{os.getpid()}-{time.monotonic_ns()}"
    with from_the_caches_alone():
        with pytest.raises(WouldBlock):
            open_path(str(tmp_path / "a" / name))  # the cache alone cannot say
        assert sandbox.canonical(str(tmp_path / "a" / name)) == str(tmp_path / "a" / name)


def test_a_path_the_kernel_must_ask_a_disk_about_would_block_on_the_loop(tmp_path: Path) -> None:
    """A FUSE disk's answers expire from the kernel's caches after a second: then only
    the disk can answer, and on the loop the lookup declines instead of waiting."""
    with fat_disk(tmp_path) as disk:
        (disk / "f.txt").write_text("x")
        on_disk, around_disk = Sandbox([disk]), Sandbox([tmp_path])  # a FUSE root; a mount below a local one
        time.sleep(2.5)
        for sandbox in (on_disk, around_disk):
            with from_the_caches_alone(), pytest.raises(WouldBlock):
                sandbox.canonical(str(disk / "f.txt"))
        with from_the_caches_alone(), pytest.raises(WouldBlock):
            lexists(str(disk / "f.txt"))
        assert on_disk.canonical(str(disk / "f.txt")) == str(disk / "f.txt")  # off the loop: it asks the disk
        with from_the_caches_alone():
            assert lexists(str(disk / "f.txt"))  # and now the answer is cached


def test_a_name_right_in_a_local_root_is_looked_up_once_without_following_it(tmp_path: Path) -> None:
    """A command's word run in the workspace (``true``, ``notes``) is a name right in a
    root: its canonical name is the root's and its own, unless it is a symlink, which
    ``canonical`` then follows. A root on a FUSE disk has no such shortcut."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "file.txt").write_text("x")
    (root / "dir").mkdir()
    (root / ".env").write_text("SECRET")
    (root / "notes").symlink_to(".env")
    (root / "away").symlink_to("/nowhere")  # dangling
    (root / "up").symlink_to(tmp_path)
    local = Sandbox([root]).local_root_at(str(root))
    assert local is not None
    for name in ("file.txt", "dir", f"missing-{time.monotonic_ns()}"):
        assert local.real_name_in_root(name) == str(root / name)
    for name in ("notes", "away", "up"):
        assert local.real_name_in_root(name) is None
    assert Sandbox([root]).local_root_at(str(root / "dir")) is None  # only a root itself
    (tmp_path / "fuse").mkdir()
    with fat_disk(tmp_path / "fuse") as disk:
        assert Sandbox([disk]).local_root_at(str(disk)) is None


def test_the_words_of_a_command_in_a_root_are_checked_through_their_symlinks(tmp_path: Path) -> None:
    """The lexical check of a command's words, as planning makes it: on the loop, and on
    a thread when a lookup there would wait (a symlink to follow, a name the kernel has
    not cached). A plain word right in the root is answered on the loop with one lookup;
    a symlink there is still followed to the denied file it names, as is a word with a
    directory in it."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / ".env").write_text("SECRET")
    (root / "notes").symlink_to(".env")
    (root / "sub" / "notes").symlink_to("../.env")
    sandbox = Sandbox([root], denied_patterns=["**/.env"])

    def checked(words: list[str], cwd: Path) -> str | None:
        try:
            with from_the_caches_alone():
                return denied_words(sandbox, words, str(cwd))
        except WouldBlock:
            return denied_words(sandbox, words, str(cwd))  # planned aside, as the planner does

    with from_the_caches_alone():  # never aside
        assert denied_words(sandbox, ["true"], str(root)) is None
        assert denied_words(sandbox, ["cat", f"readme-{time.monotonic_ns()}"], str(root)) is None
    assert checked(["cat", "notes"], root) == "notes (**/.env)"
    assert checked(["cat", "sub/notes"], root) == "sub/notes (**/.env)"
    assert checked(["cat", "notes"], root / "sub") == "notes (**/.env)"


def test_a_path_with_no_link_on_it_is_its_own_canonical_name(tmp_path: Path) -> None:
    """One cached lookup says a normalised path has no symlink on it; anything else (a
    link at the end or on the way, relative or absolute, a name not there) is left to the
    full lookup, which follows what a link says."""
    from toold_daemon.sandbox.lookups import is_canonical

    base = os.path.realpath(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "g.txt").write_text("y")
    (tmp_path / "a" / "to-g").symlink_to("../elsewhere/g.txt")  # (relative: they stay below the root)
    (tmp_path / "a" / "via").symlink_to("../elsewhere")
    (tmp_path / "a" / "absolute").symlink_to(tmp_path / "elsewhere")
    with from_the_caches_alone():
        os.stat(tmp_path / "a" / "b" / "f.txt")  # cached
        assert is_canonical(f"{base}/a/b/f.txt")
        assert is_canonical(f"{base}/a/b")
        for odd in ("a/to-g", "a/via/g.txt", "a/absolute/g.txt", "a/missing.txt"):
            assert not is_canonical(f"{base}/{odd}"), odd
        sandbox = Sandbox([tmp_path])
        root_name = str(sandbox.roots[0])
        assert str(sandbox.resolve("a/b/f.txt")) == f"{root_name}/a/b/f.txt"
        for linked in ("a/to-g", "a/via/g.txt", "a/absolute/g.txt"):
            assert str(sandbox.resolve(linked)) == f"{root_name}/elsewhere/g.txt", linked


def test_a_root_moved_aside_and_made_anew_is_looked_at_by_its_name(tmp_path: Path) -> None:
    """The lookup goes by name, not through the root held open: after the root was moved
    aside and made anew with a link where a file was, the link is followed."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("old")
    sandbox = Sandbox([root])
    root_name = str(sandbox.roots[0])
    with from_the_caches_alone():
        assert str(sandbox.resolve("sub/f.txt")) == f"{root_name}/sub/f.txt"
    os.rename(root, tmp_path / "aside")
    (root / "elsewhere").mkdir(parents=True)
    (root / "elsewhere" / "f.txt").write_text("new")
    (root / "sub").symlink_to("elsewhere")
    with from_the_caches_alone():
        os.stat(root / "sub" / "f.txt")  # cached
        assert str(sandbox.resolve("sub/f.txt")) == f"{root_name}/elsewhere/f.txt"


def test_a_commands_word_in_a_root_moved_aside_and_made_anew_is_looked_at_in_the_new_root(tmp_path: Path) -> None:
    """A word right in the root is looked up there on the loop: in the root its name
    names now. Made anew with a link to a denied file where a plain file was, the word
    is denied (the old directory, held open, said "a plain file")."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes").write_text("plain")
    (root / ".env").write_text("SECRET")
    sandbox = Sandbox([root], denied_patterns=["**/.env"])
    with from_the_caches_alone():
        assert denied_words(sandbox, ["cat", "notes"], str(root)) is None
    os.rename(root, tmp_path / "aside")
    root.mkdir()
    (root / ".env").write_text("SECRET")
    (root / "notes").symlink_to(".env")
    try:
        with from_the_caches_alone():
            said = denied_words(sandbox, ["cat", "notes"], str(root))
    except WouldBlock:
        said = denied_words(sandbox, ["cat", "notes"], str(root))  # planned aside, as the planner does
    assert said == "notes (**/.env)"


def test_a_new_name_below_a_root_moved_aside_and_made_anew_is_looked_up_in_the_new_root(tmp_path: Path) -> None:
    """A name the kernel has not cached, in a cached directory, is looked up for real on
    the loop: in the directory the root's name names now, not in the one moved aside."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    sandbox = Sandbox([root])
    root_name = str(sandbox.roots[0])
    os.rename(root, tmp_path / "aside")
    (root / "elsewhere").mkdir(parents=True)
    (root / "sub").symlink_to("elsewhere")
    name = f"never-looked-up-{os.getpid()}-{time.monotonic_ns()}"
    os.stat(root / "elsewhere")  # cached; the new name in it is not
    try:
        with from_the_caches_alone():
            resolved = str(sandbox.resolve(f"sub/{name}"))
    except WouldBlock:
        resolved = str(sandbox.resolve(f"sub/{name}"))
    assert resolved == f"{root_name}/elsewhere/{name}"


def test_a_root_gone_is_looked_at_where_a_lookup_may_wait(tmp_path: Path) -> None:
    """A root whose name no longer names a directory: on the loop nothing is answered
    from the directory it was (``WouldBlock``, and the thread's lookup says what is)."""
    from toold_daemon.sandbox.lookups import local_root

    root = tmp_path / "root"
    root.mkdir()
    local = local_root(os.path.realpath(root))
    assert local is not None
    assert local.real_name_in_root("x") == f"{local.prefix}x"
    os.rename(root, tmp_path / "aside")
    with from_the_caches_alone(), pytest.raises(WouldBlock):
        local.real_name_in_root("x")
    with from_the_caches_alone(), pytest.raises(WouldBlock):
        local.canonical_below(f"{local.prefix}x")
