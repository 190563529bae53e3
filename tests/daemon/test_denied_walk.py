"""The walk that finds denied and protected entries checks a name before it builds a path:
that shortcut must never skip an entry the full patterns would catch."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.config import DEFAULT_DENIED_PATTERNS, Config
from toold_daemon.globmatch import last_name_glob
from toold_daemon.sandbox import Sandbox, build_sandbox, paths, protected_patterns
from toold_daemon.sandbox.denied_tree import EVERYTHING_BELOW as ALL
from toold_daemon.sandbox.denied_tree import find_denied

PIECES = ["a", ".env", ".env.local", "id_rsa", "id_rsa.pub", "x.pem", "key", ".ssh", ".gnupg", "etc", "shadow",
          ".aws", "credentials", ".git", "config", "x.pth", ".bashrc", "src", ".vscode", "b.key", "c"]  # fmt: skip
EXTRA_PATTERNS = st.lists(
    st.sampled_from(["**/*.{key,pem}", "secrets/**", "**/a/c", "*.pth", "**/[.]env", "/srv/**/shadow", "**/id_*"]),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=5), EXTRA_PATTERNS)
def test_a_name_the_shortcut_passes_over_is_never_denied_or_protected(parts: list[str], extra: list[str]) -> None:
    root = Path("/srv/work")
    sandbox = Sandbox(
        [root],
        denied_patterns=[*DEFAULT_DENIED_PATTERNS, *extra],
        protected_patterns=[*protected_patterns(Config()), *extra],
        verified=False,
    )
    path = str(root.joinpath(*parts))
    name = parts[-1]
    ancestors = [str(root.joinpath(*parts[:n])) for n in range(1, len(parts))]
    # The walk never looks at names inside a denied directory (all of it is denied) or
    # inside a protected entry (its outermost is what is kept): only the rest must pass.
    inside_denied = any(
        sandbox.denied_pattern(a) is not None or sandbox.denied_pattern(a + ALL) is not None for a in ancestors
    )
    inside_protected = any(
        sandbox.protected_pattern(a) is not None or sandbox.protected_pattern(a + ALL) is not None for a in ancestors
    )
    denied = sandbox.denied_pattern(path) is not None or sandbox.denied_pattern(path + ALL) is not None
    protected = sandbox.protected_pattern(path) is not None or sandbox.protected_pattern(path + ALL) is not None
    with_protected, denied_only = sandbox.name_screen(protected=True), sandbox.name_screen(protected=False)
    if denied and not inside_denied:
        assert sandbox.may_be_denied(name), (path, extra)
        assert with_protected is None or with_protected(name), (path, extra)
        assert denied_only is None or denied_only(name), (path, extra)
    if protected and not inside_protected:
        assert sandbox.may_be_protected(name), (path, extra)
        assert with_protected is None or with_protected(name), (path, extra)


def test_last_name_globs() -> None:
    assert last_name_glob("**/*.pem") == "*.pem"
    assert last_name_glob("**/.ssh/**") == ".ssh"
    assert last_name_glob("**/.aws/credentials") == "credentials"
    assert last_name_glob("secrets/**") == "secrets"
    assert last_name_glob("**") is None and last_name_glob("a/**/**") == "a"
    assert last_name_glob("{a/b,c}") is None  # an alternative holding a separator


def reference_walk(sandbox: Sandbox, root: Path) -> tuple[set[str], set[str], set[str]]:
    """Every entry checked against the full patterns, the way the walk used to."""
    files, directories, protected = set(), set(), set()
    denied_inodes = set()
    for directory, dirnames, filenames in os.walk(root):
        if any(directory == d or directory.startswith(d + "/") for d in directories):
            for name in filenames:
                st_ = os.stat(os.path.join(directory, name), follow_symlinks=False)
                denied_inodes.add((st_.st_dev, st_.st_ino))
            continue
        for name in [*dirnames, *filenames]:
            path = os.path.join(directory, name)
            below = name in dirnames and sandbox.protected_pattern(path + ALL) is not None
            if not any(path == p or path.startswith(p + "/") for p in protected) and (
                sandbox.protected_pattern(path) is not None or below
            ):
                protected.add(path)
            if name in dirnames:
                if sandbox.denied_pattern(path) is not None or sandbox.denied_pattern(path + ALL) is not None:
                    directories.add(path)
            elif sandbox.denied_pattern(path) is not None:
                files.add(path)
                st_ = os.stat(path, follow_symlinks=False)
                denied_inodes.add((st_.st_dev, st_.st_ino))
    for directory, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(directory, name)
            st_ = os.stat(path, follow_symlinks=False)
            if (st_.st_dev, st_.st_ino) in denied_inodes and not any(path.startswith(d + "/") for d in directories):
                files.add(path)
    return files, directories, protected


def test_the_walk_finds_what_checking_every_entry_finds(tmp_path: Path) -> None:
    root = tmp_path / "work"
    tree = [["src", "a.py"], ["src", ".env"], [".ssh", "id_rsa"], ["deep", "er", "x.pem"], [".git", "config"]]
    tree += [["lib", "site.pth"], [".aws", "credentials"], ["notes", "credentials"], [".vscode", "s.json"]]
    for parts in tree:
        path = root.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    os.link(root / "src" / ".env", root / "src" / "innocent.txt")  # another name of a denied file
    os.link(root / "src" / "a.py", root / "src" / "a-too.py")  # another name of an ordinary one
    sandbox = build_sandbox(Config(), [root])
    found = find_denied(sandbox, max_entries=10_000, protected=True)
    files, directories, protected = reference_walk(sandbox, root)
    assert set(found.files) == files and str(root / "src" / "innocent.txt") in files
    assert set(found.directories) == directories and str(root / ".ssh") in directories
    assert set(found.protected) == protected and str(root / ".git") in protected
    assert str(root / ".vscode") in protected  # every entry below it is: the directory is kept whole
    assert found.complete


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=4), min_size=1, max_size=12), EXTRA_PATTERNS)
def test_the_walk_of_any_tree_finds_what_checking_every_entry_finds(
    tmp_path_factory: pytest.TempPathFactory, paths: list[list[str]], extra: list[str]
) -> None:
    root = tmp_path_factory.mktemp("tree") / "work"
    root.mkdir()
    for parts in paths:
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
        except OSError:
            pass  # a file stands where a directory would go: the tree is what it is
    sandbox = Sandbox(
        [root],
        denied_patterns=[*DEFAULT_DENIED_PATTERNS, *extra],
        protected_patterns=[*protected_patterns(Config()), *extra],
    )
    found = find_denied(sandbox, max_entries=10_000, protected=True)
    files, directories, protected = reference_walk(sandbox, root)
    assert (set(found.files), set(found.directories), set(found.protected)) == (files, directories, protected)
    denied_only = find_denied(sandbox, max_entries=10_000)
    assert (set(denied_only.files), set(denied_only.directories)) == (files, directories)


def test_a_homes_dot_entries_below_a_root_are_found_protected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A root holding a home directory (this host's user database stands in for by a
    home made here): the walk finds the home's dot-entries, whatever their names."""
    root = tmp_path / "work"
    home = root / "home" / "alice"
    for parts in [[".bashrc"], [".config", "x.toml"], ["plain.txt"], ["code", ".hidden"]]:
        home.joinpath(*parts).parent.mkdir(parents=True, exist_ok=True)
        home.joinpath(*parts).write_text("x")
    monkeypatch.setattr(paths, "home_directories", lambda: frozenset({str(home)}))
    sandbox = Sandbox([root], denied_patterns=DEFAULT_DENIED_PATTERNS, protect_homes=True)
    found = find_denied(sandbox, max_entries=10_000, protected=True)
    assert set(found.protected) == {str(home / ".bashrc"), str(home / ".config")}
    assert set(found.protected) == reference_walk(sandbox, root)[2]


def test_every_other_name_of_a_denied_file_is_found(tmp_path: Path) -> None:
    """Several hard links to one denied file, and to an ordinary one, in several directories:
    each name of the denied file is covered, no name of the ordinary one is."""
    root = tmp_path / "work"
    for directory in ("a", "b", "c"):
        (root / directory).mkdir(parents=True)
    (root / "a" / ".env").write_text("SECRET=1\n")
    (root / "a" / "plain.txt").write_text("x")
    others = [root / "a" / "one.txt", root / "b" / "two.txt", root / "c" / "three.txt"]
    for other in others:
        os.link(root / "a" / ".env", other)
        os.link(root / "a" / "plain.txt", other.with_name("plain-" + other.name))
    found = find_denied(build_sandbox(Config(), [root]), max_entries=10_000)
    assert set(found.files) == {str(root / "a" / ".env"), *map(str, others)}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to walk as another user")
def test_a_directory_that_may_be_passed_through_but_not_listed_is_reported() -> None:
    """A command can open ``passable/.env`` by name in a directory it may not list
    (mode 0311): the walk cannot see the file to cover it, so it names the directory."""
    with tempfile.TemporaryDirectory() as tmp:  # (pytest's own are closed to other users)
        os.chmod(tmp, 0o755)
        _walk_as_nobody(Path(tmp))


def _walk_as_nobody(tmp_path: Path) -> None:
    (tmp_path / "passable").mkdir(mode=0o311)
    (tmp_path / "closed").mkdir(mode=0o300)
    (tmp_path / "passable" / ".env").write_text("SECRET=1\n")
    os.chmod(tmp_path / "passable", 0o311)  # (mkdir's mode passes through the umask)
    os.chmod(tmp_path / "closed", 0o300)
    sandbox = Sandbox([tmp_path], denied_patterns=list(DEFAULT_DENIED_PATTERNS), verified=False)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the walk runs as the user, as in a zygote
        try:
            os.setgid(65534)
            os.setuid(65534)
            found = find_denied(sandbox, max_entries=1000)
            os.write(write, "\n".join(["files:", *found.files, "unlisted:", *found.unlisted]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reported:
        lines = reported.read().splitlines()
    os.waitpid(pid, 0)
    assert lines == ["files:", "unlisted:", str(tmp_path / "passable")]  # not "closed": no passing through
