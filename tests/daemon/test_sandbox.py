"""Path validation and symlink safety, on a real filesystem."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import link_trees
from toold_daemon.config import DEFAULT_DENIED_PATTERNS
from toold_daemon.errors import ToolError
from toold_daemon.sandbox import Sandbox
from toold_daemon.sandbox import paths as paths_module
from toold_daemon.sandbox.paths import _canonical


@pytest.fixture
def sandbox(root: Path) -> Sandbox:
    (root / "dir").mkdir()
    (root / "dir" / "f.txt").write_text("in")
    return Sandbox([root], denied_patterns=DEFAULT_DENIED_PATTERNS)


def code_of(sandbox: Sandbox, raw: str) -> str:
    with pytest.raises(ToolError) as info:
        sandbox.resolve(raw)
    return info.value.code


def test_relative_path_resolves_inside(sandbox: Sandbox, root: Path) -> None:
    assert sandbox.resolve("dir/f.txt") == root.resolve() / "dir" / "f.txt"
    assert sandbox.resolve("dir/./new/file") == root.resolve() / "dir" / "new" / "file"


@pytest.mark.parametrize("raw", ["../x", "dir/../../x", "a/b/../../.."])
def test_dotdot_is_rejected(sandbox: Sandbox, raw: str) -> None:
    assert code_of(sandbox, raw) == "PATH_TRAVERSAL"


def test_absolute_is_rejected_unless_allowed(sandbox: Sandbox, root: Path) -> None:
    assert code_of(sandbox, "/etc/passwd") == "ABSOLUTE_PATH"
    allowing = Sandbox([root], allow_absolute=True)
    assert allowing.resolve(str(root / "dir" / "f.txt")) == root.resolve() / "dir" / "f.txt"
    with pytest.raises(ToolError) as info:
        allowing.resolve("/etc/passwd")
    assert info.value.code == "PATH_OUTSIDE_SANDBOX"


def test_sibling_with_common_prefix_is_outside(tmp_path: Path) -> None:
    inner = tmp_path / "root"
    evil = tmp_path / "root-evil"
    inner.mkdir()
    evil.mkdir()
    (inner / "link").symlink_to(evil)
    sandbox = Sandbox([inner], allow_absolute=True)
    assert code_of(sandbox, str(evil / "x")) == "PATH_OUTSIDE_SANDBOX"
    assert code_of(sandbox, "link/x") == "PATH_OUTSIDE_SANDBOX"


def test_symlink_out_of_root_is_rejected(sandbox: Sandbox, root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (root / "escape").symlink_to(outside)
    (root / "escape_dir").symlink_to(tmp_path)
    assert code_of(sandbox, "escape") == "PATH_OUTSIDE_SANDBOX"
    assert code_of(sandbox, "escape_dir/outside.txt") == "PATH_OUTSIDE_SANDBOX"


def test_symlink_inside_root_is_followed_to_its_target(sandbox: Sandbox, root: Path) -> None:
    (root / "alias").symlink_to(root / "dir")
    assert sandbox.resolve("alias/f.txt") == root.resolve() / "dir" / "f.txt"


@pytest.mark.parametrize(
    "raw",
    [
        ".ssh/id_rsa",
        "a/.ssh/config",
        "id_rsa.pub",
        "server.pem",
        "x/tls.key",
        ".env",
        ".env.local",
        ".git-credentials",
        ".netrc",
    ],
)
def test_default_denies(sandbox: Sandbox, raw: str) -> None:
    assert code_of(sandbox, raw) == "DENIED_PATTERN"


def test_denied_pattern_applies_to_symlink_target(sandbox: Sandbox, root: Path) -> None:
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_rsa").write_text("key")
    (root / "notes.txt").symlink_to(root / ".ssh" / "id_rsa")
    assert code_of(sandbox, "notes.txt") == "DENIED_PATTERN"


def test_empty_and_nul_are_bad_args(sandbox: Sandbox) -> None:
    assert code_of(sandbox, "") == "BAD_ARGS"
    assert code_of(sandbox, "a\x00b") == "BAD_ARGS"


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "dir", "f.txt", "link", ""]), min_size=1, max_size=6))
def test_resolved_paths_are_always_inside_the_root(sandbox: Sandbox, parts: list[str]) -> None:
    raw = "/".join(parts)
    try:
        resolved = sandbox.resolve(raw)
    except ToolError:
        return
    assert sandbox.root_of(resolved) is not None


def test_open_refuses_a_symlink_swapped_in_after_validation(sandbox: Sandbox, root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    target = sandbox.resolve("dir/f.txt")
    (root / "dir" / "f.txt").unlink()
    (root / "dir" / "f.txt").symlink_to(secret)
    with pytest.raises(ToolError) as info:
        sandbox.open(target)
    assert info.value.code == "SYMLINK_REFUSED"
    # The same for a directory component swapped for a symlink.
    (root / "dir" / "f.txt").unlink()
    os.rename(root / "dir", root / "dir.old")
    (root / "dir").symlink_to(tmp_path)
    with pytest.raises(ToolError):
        sandbox.open(target)


def test_racing_symlink_swaps_never_leak_outside_content(sandbox: Sandbox, root: Path, tmp_path: Path) -> None:
    """A thread swaps a file and a symlink to an outside file as fast as it can while we read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    victim = root / "dir" / "race.txt"
    victim.write_text("safe")
    stop = threading.Event()

    def swapper() -> None:
        link = root / "dir" / "race.link"
        plain = root / "dir" / "race.plain"
        while not stop.is_set():
            try:
                link.symlink_to(secret)
                os.replace(link, victim)
                plain.write_text("safe")
                os.replace(plain, victim)
            except OSError:
                pass

    thread = threading.Thread(target=swapper)
    thread.start()
    seen: set[str] = set()
    try:
        for _ in range(3000):
            try:
                path = sandbox.resolve("dir/race.txt")
                fd = sandbox.open(path)
            except ToolError:
                continue
            with os.fdopen(fd) as f:
                seen.add(f.read())
    finally:
        stop.set()
        thread.join()
    assert "SECRET" not in seen
    assert "safe" in seen


def test_a_root_inside_a_denied_location_is_refused(tmp_path: Path) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    with pytest.raises(ValueError, match="denied by pattern"):
        Sandbox([ssh], denied_patterns=DEFAULT_DENIED_PATTERNS)


def test_absolute_denied_patterns_match_the_absolute_path(root: Path) -> None:
    (root / "private").mkdir()
    sandbox = Sandbox([root], denied_patterns=[f"{root.resolve()}/private/**"])
    assert code_of(sandbox, "private/x") == "DENIED_PATTERN"
    assert sandbox.resolve("public") == root.resolve() / "public"


@pytest.mark.parametrize("within_a_plan", [False, True], ids=["alone", "within one plan"])
@settings(max_examples=200, deadline=None)
@given(
    drawn=link_trees.entries(("dir", "file", "link", "outside link")),
    asked=st.lists(st.lists(st.sampled_from([*link_trees.NAMES, "new"]), min_size=1, max_size=4), max_size=10),
)
def test_canonical_names_equal_realpath_for_missing_paths_too(
    tmp_path_factory: pytest.TempPathFactory, drawn: link_trees.Entries, asked: list[list[str]], within_a_plan: bool
) -> None:
    """Missing paths (new files, dangling links on the way, files used as directories,
    links out of the tree and loops) get the name ``os.path.realpath`` gives them; also
    within one plan, which remembers the missing paths and the directories above them as
    it goes (a dangling link beside a remembered directory is still followed)."""
    base = str(tmp_path_factory.mktemp("tree"))
    link_trees.make_tree(base, drawn, outside=str(tmp_path_factory.mktemp("outside")))
    with paths_module.remembering_missing() if within_a_plan else contextlib.nullcontext():
        for parts in asked:
            path = os.path.join(base, *parts)
            assert _canonical(path) == os.path.realpath(path), path


def test_missing_names_in_one_directory_cost_one_lookup_more_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command's words are mostly missing names in its directory (``git status
    --short``): within one plan, the directory is opened and read back once, and each
    further name costs the lookup that finds it missing and one that finds nothing there."""
    sandbox = Sandbox([tmp_path])
    root = str(sandbox.roots[0])
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    names = [f"word{n}" for n in range(10)]
    lookups = _counting_lookups(monkeypatch)
    with paths_module.remembering_missing():
        seen = [sandbox.canonical(f"{root}/{name}") for name in names]
        assert sandbox.canonical(f"{root}/dangling") == f"{root}/nowhere"  # followed, as realpath does
    assert seen == [f"{root}/{name}" for name in names]
    assert lookups[0] <= 3 + 2 * (len(names) - 1) + 3, lookups[0]


def test_drawn_trees_stay_below_their_base(tmp_path: Path) -> None:
    """The property tests' trees: a link to ``..`` and then an entry through it made that
    entry beside the tree, in pytest's temporary root, where a link loop (``c -> c``)
    made pytest fail at the end of the session."""
    base = tmp_path / "base"
    base.mkdir()
    link_trees.make_tree(str(base), [(["a"], "link", [".."]), (["a", "c"], "link", ["c"]), (["a", "f"], "file", ["x"])])
    assert sorted(os.listdir(tmp_path)) == ["base"]
    assert os.readlink(base / "a") == ".."


def _counting_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the sandbox's path lookups from here on (the one element of the list)."""
    lookups = [0]
    real_open = paths_module.open_path

    def counting(*args: object, **kwargs: object) -> int:
        lookups[0] += 1
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paths_module, "open_path", counting)
    return lookups


def test_missing_paths_of_one_plan_are_each_walked_up_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An undo's plan names every directory of a tree that is gone, deepest first; each
    was walked up to the deepest directory that exists (a tree 1,300 deep: 845,000
    lookups). Within one plan each is now walked up only as far as one already known,
    and the names are the same."""
    sandbox = Sandbox([tmp_path])
    root = str(sandbox.roots[0])
    chain = [root + "/gone" + "/d" * depth for depth in range(300, 0, -1)]  # deepest first
    lookups = _counting_lookups(monkeypatch)
    alone = [sandbox.canonical(path) for path in chain]
    walked_alone, lookups[0] = lookups[0], 0
    with paths_module.remembering_missing():
        remembered = [sandbox.canonical(path) for path in chain]
    assert remembered == alone == chain
    assert walked_alone > 40_000 and lookups[0] < 2 * len(chain), (walked_alone, lookups[0])
