"""Undo puts trees back exactly: a moved directory, files made in directories the batch
made, a deleted tree, and a mix of them in one batch. And it refuses, changing nothing,
when something below a directory the batch made has changed since."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.acls import posix_acl
from tests.conftest import DaemonProcess, start_daemon
from toold_client import CallSpec

CONFIG = """
[tools.approval]
preset = "all"

[[tools.approval.rules]]
tool = "*"
decision = "allow"
conditions = [{ param = "path", operator = "matches", value = ".*" }]
"""


def tree(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every entry below ``root``: kind, mode and content (a symlink's target)."""
    found: dict[str, tuple[str, int, bytes]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            found[rel] = ("link", 0, os.fsencode(os.readlink(path)))
        elif stat.S_ISDIR(st.st_mode):
            found[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
        else:
            found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def seed(root: Path) -> None:
    (root / "src/pkg/deep").mkdir(parents=True)
    (root / "src/pkg/a.py").write_text("a = 1\n")
    (root / "src/pkg/deep/b.bin").write_bytes(bytes(range(256)))
    os.chmod(root / "src/pkg/deep/b.bin", 0o640)
    (root / "src/pkg/link").symlink_to("a.py")
    (root / "old").mkdir()
    (root / "old/gone.txt").write_text("bye\n")
    (root / "old/inner").mkdir(mode=0o750)
    (root / "old/inner/c.txt").write_text("c\n")


BATCHES = {
    "move a directory": [CallSpec("move_file", {"source": "src/pkg", "destination": "lib/pkg"}, "m")],
    "write into directories that did not exist": [
        CallSpec("write_file", {"path": "new/a/b/c.txt", "content": "nested\n"}, "w")
    ],
    "delete a tree": [CallSpec("delete_file", {"path": "old", "recursive": True}, "d")],
    "all of them": [
        CallSpec("write_file", {"path": "new/x/y.txt", "content": "y\n"}, "w"),
        CallSpec("move_file", {"source": "src/pkg", "destination": "new/x/pkg"}, "m"),
        CallSpec("delete_file", {"path": "old", "recursive": True}, "d"),
        CallSpec("write_file", {"path": "src/readme.md", "content": "r\n"}, "w2"),
    ],
}


@pytest.mark.parametrize("name", BATCHES)
def test_undo_restores_the_tree_exactly(tmp_path: Path, root: Path, name: str) -> None:
    seed(root)
    before = tree(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            outcome = c.submit(BATCHES[name], batch_id=f"b-{len(name)}")
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
            assert tree(root) != before
            c.undo(outcome.batch_id)
    finally:
        d.stop()
    assert tree(root) == before


def test_a_change_below_a_directory_the_batch_made_is_a_conflict(tmp_path: Path, root: Path) -> None:
    """Someone added a file inside the moved directory after the batch: undo must not
    take it away unasked; nothing is restored."""
    seed(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            outcome = c.submit(BATCHES["move a directory"], batch_id="conflict")
            (root / "lib/pkg/mine.txt").write_text("keep me\n")
            after = tree(root)
            undone = c.undo(outcome.batch_id)
            (result,) = undone.results
            assert not result.ok and result.error.code == "UNDO_CONFLICT", result.content
            assert tree(root) == after
    finally:
        d.stop()


def test_a_file_added_to_a_directory_an_earlier_call_made_is_a_conflict(tmp_path: Path, root: Path) -> None:
    """The directory's recorded tree is outdated by the batch's own later calls: its
    contents are checked against the plan instead, and a stranger is a conflict."""
    seed(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            outcome = c.submit(BATCHES["all of them"], batch_id="stranger")
            (root / "new/x/stranger.txt").write_text("not the batch's\n")
            after = tree(root)
            (result,) = c.undo(outcome.batch_id).results
    finally:
        d.stop()
    assert not result.ok and result.error.code == "UNDO_CONFLICT" and "new/x/stranger.txt" in result.content
    assert tree(root) == after


MODE_CHANGED_SINCE = {
    # (the batch, the path someone chmods after it)
    "a file the batch overwrote": (
        [CallSpec("write_file", {"path": "src/pkg/a.py", "content": "a = 2\n", "overwrite": True}, "w")],
        "src/pkg/a.py",
    ),
    "a file the batch made": ([CallSpec("write_file", {"path": "run.sh", "content": "echo\n"}, "w")], "run.sh"),
    "a directory the batch made": (BATCHES["write into directories that did not exist"], "new/a"),
    "a directory the batch moved": (BATCHES["move a directory"], "lib/pkg"),
}


@pytest.mark.parametrize("name", MODE_CHANGED_SINCE)
def test_a_mode_changed_since_is_a_conflict(tmp_path: Path, root: Path, name: str) -> None:
    """A chmod after the batch is a change as new contents are: the undo changes nothing
    and names the path; forced, it puts everything back, the mode included."""
    seed(root)
    before = tree(root)
    calls, chmodded = MODE_CHANGED_SINCE[name]
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            outcome = c.submit(calls, batch_id=f"mode-{len(name)}")
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
            os.chmod(root / chmodded, 0o700 if (root / chmodded).is_dir() else 0o755)
            after = tree(root)
            (result,) = c.undo(outcome.batch_id).results
            assert not result.ok and result.error.code == "UNDO_CONFLICT", result.content
            assert chmodded in result.content
            assert tree(root) == after
            (forced,) = c.undo(outcome.batch_id, force=True).results
            assert forced.ok, forced.content
    finally:
        d.stop()
    assert tree(root) == before


#: POSIX ACLs as the kernel stores them: an access ACL giving uid 4243 read, and (for a
#: directory) a default one its new files inherit.
ACL = posix_acl(owner=7, group=5, other=0, users={4243: 5})


def owners_and_attributes(root: Path) -> dict[str, tuple[int, int, dict[str, bytes]]]:
    """Every file's and directory's owner, group and extended attributes below ``root``."""
    found = {}
    for path in sorted(root.rglob("*")):
        if not path.is_symlink():
            xattrs = {name: os.getxattr(path, name) for name in os.listxattr(path)}
            found[str(path.relative_to(root))] = (path.stat().st_uid, path.stat().st_gid, xattrs)
    return found


def dress(root: Path) -> None:
    """Owners, groups, ACLs and a user attribute on part of the seeded tree."""
    try:
        for path, gid in (("old", 4242), ("old/gone.txt", 4243), ("old/inner", 4244), ("src/pkg/a.py", 4245)):
            os.chown(root / path, gid + 100, gid)
            os.setxattr(root / path, "user.origin", f"made by {gid}".encode())
        os.setxattr(root / "old", "system.posix_acl_default", ACL)
        os.setxattr(root / "old/inner", "system.posix_acl_access", ACL)
        os.setxattr(root / "old/gone.txt", "system.posix_acl_access", ACL)
    except OSError as exc:
        pytest.skip(f"this filesystem keeps no such attributes: {exc.strerror}")


@pytest.mark.parametrize("name", ["delete a tree", "move a directory", "all of them"])
def test_undo_gives_back_groups_acls_and_attributes(tmp_path: Path, root: Path, name: str) -> None:
    """A deleted tree comes back with each file's and directory's owner (the undoer here
    is root, who may give it), group, POSIX ACLs (a directory's default ACL too) and
    extended attributes, not the undoer's owner and group and none of them."""
    seed(root)
    dress(root)
    before, dressed = tree(root), owners_and_attributes(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            outcome = c.submit(BATCHES[name], batch_id=f"attributes-{len(name)}")
            assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
            (undone,) = c.undo(outcome.batch_id).results
            assert undone.ok, undone.content
    finally:
        d.stop()
    assert tree(root) == before
    assert owners_and_attributes(root) == dressed


def test_a_deleted_tree_of_thousands_of_files_is_undone(tmp_path: Path, root: Path) -> None:
    """The undo's one call names every path of the tree (2,500 here, 600 KB of
    arguments): it is the daemon's own call, not bound by what a client may send
    (max_tool_args_bytes, 256 KiB), which refused it whole."""
    many = root / "generated/sub"
    many.mkdir(parents=True)
    for i in range(2500):
        (many / f"a_file_name_as_generated_code_has_{i:05}.txt").write_text(f"{i}\n")
    before = tree(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=120) as c:
            outcome = c.submit([CallSpec("delete_file", {"path": "generated", "recursive": True}, "d")])
            assert outcome.results[0].ok, outcome.results[0].content
            assert not (root / "generated").exists()
            (undone,) = c.undo(outcome.batch_id).results
            assert undone.ok, undone.content
    finally:
        d.stop()
    assert tree(root) == before


def test_a_deleted_tree_as_large_as_the_undo_bound_is_undone(tmp_path: Path, root: Path) -> None:
    """Pre-images up to the batch's undo bound (64 MiB by default) travel back from the
    worker with the delete's outcome, and to it again with the undo's request: both
    frames are larger than the 64 MiB every other message is held to. Before, the delete
    ran, its outcome was refused (\"its worker broke the protocol\"), the files were gone
    and nothing was journaled to undo it."""
    big = root / "assets"
    (big / "small").mkdir(parents=True)
    for i in range(47):
        (big / f"b{i}.bin").write_bytes(os.urandom(1_427_000))  # 67.07 MB: within the bound
    for i in range(600):
        (big / "small" / f"a_small_file_with_a_longish_name_{i}.txt").write_text("x\n")
    before = tree(root)
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=120) as c:
            outcome = c.submit([CallSpec("delete_file", {"path": "assets", "recursive": True}, "d")])
            (deleted,) = outcome.results
            assert deleted.ok and "not undoable" not in deleted.content, deleted.content[:300]
            (undone,) = c.undo(outcome.batch_id).results
            assert undone.ok, undone.content[:300]
        assert tree(root) == before
    finally:
        d.stop()
        shutil.rmtree(big, ignore_errors=True)


def test_an_undo_that_fails_midway_puts_back_what_it_had_done(tmp_path: Path, root: Path) -> None:
    """The saved bytes of one file are gone when the undo runs: it fails on that file,
    after it had already taken away a file and a tree the batch made. Both come back:
    the workspace is exactly as before the undo, and the result says so."""
    seed(root)
    (root / "kept.txt").write_text("original\n")
    d = start_daemon(tmp_path, root, config=CONFIG)
    try:
        with d.client(timeout=60) as c:
            calls = [
                CallSpec("write_file", {"path": "made/deep/new.txt", "content": "new\n"}, "w"),
                CallSpec("move_file", {"source": "src/pkg", "destination": "lib/pkg"}, "m"),
                CallSpec("write_file", {"path": "kept.txt", "content": "changed\n", "overwrite": True}, "o"),
            ]
            outcome = c.submit(calls, batch_id="midway")
            assert all(r.ok for r in outcome.results)
            for blob in (tmp_path / "state").rglob("*"):
                if blob.is_file() and blob.read_bytes() == b"original\n":
                    blob.unlink()  # the pre-image of kept.txt is lost
            after = tree(root)
            (result,) = c.undo(outcome.batch_id).results
    finally:
        d.stop()
    assert not result.ok and result.error.code == "UNDO_FAILED", result.content
    assert "nothing was changed" in result.content, result.content
    assert tree(root) == after
    assert not [p for p in root.rglob(".toold-undo-*")]


NAMES = st.sampled_from(["a", "b", "c", "d"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)
CONTENT = st.binary(max_size=64).map(lambda b: b.decode("latin-1"))


def operations(paths: st.SearchStrategy[str]) -> st.SearchStrategy[list[CallSpec]]:
    """Writes, edits (after a read, as edits require), patches, deletes and moves, each
    as the calls it takes; ``paths`` without a suffix (``p`` names a directory, ``p.txt``
    a file), moves to fresh paths mostly."""
    single = st.one_of(
        st.builds(
            lambda p, t: CallSpec("write_file", {"path": p + ".txt", "content": t, "overwrite": True}), paths, CONTENT
        ),
        st.builds(lambda p: CallSpec("delete_file", {"path": p, "recursive": True}), paths),
        # a file where a directory may be (after its delete): a path below a file is not there
        st.builds(lambda p, t: CallSpec("write_file", {"path": p, "content": t, "overwrite": True}), paths, CONTENT),
        st.builds(lambda p: CallSpec("delete_file", {"path": p + ".txt"}), paths),
        st.builds(lambda s, d: CallSpec("move_file", {"source": s, "destination": d}), paths, PATHS),
        st.builds(lambda s, d: CallSpec("move_file", {"source": s + ".txt", "destination": d + ".txt"}), paths, PATHS),
        st.builds(
            lambda p, t: CallSpec(
                "apply_patch", {"patch": f"*** Begin Patch\n*** Add File: {p}.txt\n+{t}\n*** End Patch\n"}
            ),
            paths,
            st.sampled_from(["added", "line"]),
        ),
        st.builds(
            lambda p, d: CallSpec(
                "apply_patch",
                {"patch": f"*** Begin Patch\n*** Update File: {p}.txt\n*** Move to: {d}.txt\n*** End Patch\n"},
            ),
            paths,
            paths,
        ),
        st.builds(
            lambda p: CallSpec("apply_patch", {"patch": f"*** Begin Patch\n*** Delete File: {p}.txt\n*** End Patch\n"}),
            paths,
        ),
    ).map(lambda call: [call])
    edit = st.builds(
        lambda p, a, b: [
            CallSpec("read_file", {"path": p + ".txt"}),
            CallSpec("edit_file", {"path": p + ".txt", "edits": [{"target": a, "replacement": b}]}),
        ],
        paths,
        st.sampled_from(["a", "\n", "x", "\x00"]),
        st.sampled_from(["", "b\n", "zz"]),
    )
    return st.one_of(single, edit)


def flat(groups: list[list[CallSpec]]) -> list[CallSpec]:
    return [call for group in groups for call in group]


OPERATIONS = operations(PATHS)
TREES = st.dictionaries(
    PATHS.map(lambda p: p + ".txt"), st.tuples(CONTENT, st.sampled_from([0o600, 0o644, 0o755])), min_size=1, max_size=6
)
LINKS = st.dictionaries(PATHS.map(lambda p: p + ".lnk"), PATHS.map(lambda p: p + ".txt"), max_size=2)


@pytest.fixture(scope="module")
def undoing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    from tests.conftest import module_daemon

    with module_daemon(tmp_path_factory, "undo-property", CONFIG) as d:
        yield d


@settings(max_examples=int(os.environ.get("TOOLD_UNDO_EXAMPLES", "80")), deadline=None)
@given(files=TREES, links=LINKS, data=st.data())
def test_any_batch_undone_leaves_the_tree_as_it_was(
    undoing: DaemonProcess, files: dict[str, tuple[str, int]], links: dict[str, str], data: st.DataObject
) -> None:
    """Hypothesis draws a tree (files of several modes, symlinks) and a batch of writes,
    edits, patches (adds, moves, deletes), deletes (files and whole trees) and moves
    (files and directories); whatever of it succeeded, undoing it restores every
    entry's kind, mode and bytes, and is never refused."""
    root = undoing.root
    shutil.rmtree(root)
    root.mkdir()
    for name, (text, mode) in files.items():
        path = root / name
        if any(parent.is_file() for parent in path.parents if root in parent.parents or parent == root):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            continue
        path.write_text(text, encoding="latin-1")
        os.chmod(path, mode)
    for name, target in links.items():  # symlinks, dangling or not, moved and deleted like files
        link = root / name
        if link.parent.is_dir() and not os.path.lexists(link):
            link.symlink_to(target)
    before = tree(root)
    # paths mostly drawn from what exists (directories, and files without their suffix)
    existing = sorted({name.removesuffix(".txt") for name in before if not name.endswith(".lnk")})
    paths = st.one_of(*[st.sampled_from(existing)] * 3, PATHS) if existing else PATHS
    calls = flat(data.draw(st.lists(operations(paths), min_size=1, max_size=4), label="calls"))
    with undoing.client(timeout=60) as c:
        numbered = [CallSpec(call.name, call.arguments, f"c{i}") for i, call in enumerate(calls)]
        outcome = c.submit(numbered)
        after = tree(root)
        for call, result in zip(numbered, outcome.results, strict=True):
            event(f"{call.name} {'ran' if result.ok else 'failed ' + (result.error.code if result.error else '')}")
        if not any(r.ok for r in outcome.results):
            assert after == before
            return
        (result,) = c.undo(outcome.batch_id).results
    # Nothing changed the tree between the batch and its undo, so the undo is never
    # refused: whatever a move brought along is recorded entry by entry.
    assert result.ok, result.content
    assert tree(root) == before


def test_a_move_that_cannot_happen_leaves_no_directory_behind(undoing: DaemonProcess) -> None:
    """Found by the property above: moving a missing source to ``a/b`` made ``a`` first."""
    with undoing.client(timeout=30) as c:
        missing = c.call("move_file", {"source": "nothing-here", "destination": "made/for/it"})
        (undoing.root / "dir").mkdir(exist_ok=True)
        into_itself = c.call("move_file", {"source": "dir", "destination": "dir/inside"})
    assert not missing.ok and missing.error.code == "FILE_NOT_FOUND"
    assert not (undoing.root / "made").exists()
    assert not into_itself.ok and not (undoing.root / "dir/inside").exists()


def test_a_file_overwritten_where_a_moved_directory_brought_it_is_taken_away(undoing: DaemonProcess) -> None:
    """Found by the property test: a/a.txt made, a moved to b, b/a.txt overwritten. The
    batch first saw b/a.txt existing, but before the batch it was not there at all."""
    root = undoing.root
    shutil.rmtree(root)
    root.mkdir()
    with undoing.client(timeout=60) as c:
        outcome = c.submit(
            [
                CallSpec("write_file", {"path": "a/a.txt", "content": "", "overwrite": True}, "w1"),
                CallSpec("move_file", {"source": "a", "destination": "b"}, "m"),
                CallSpec("write_file", {"path": "b/a.txt", "content": "x", "overwrite": True}, "w2"),
            ]
        )
        assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == {}


def test_a_directory_moved_then_written_into_is_undone_exactly(undoing: DaemonProcess) -> None:
    """a/ (with a file and a subdirectory) moved to b/, then b/ written into, a file in it
    moved out and another overwritten: the undo knows what the move brought, entry by
    entry, so it is not mistaken for someone else's files and the tree comes back."""
    root = undoing.root
    shutil.rmtree(root)
    root.mkdir()
    (root / "a/sub").mkdir(parents=True)
    (root / "a/x.txt").write_text("x\n")
    (root / "a/sub/y.txt").write_text("y\n")
    os.chmod(root / "a/sub", 0o750)
    before = tree(root)
    with undoing.client(timeout=60) as c:
        outcome = c.submit(
            [
                CallSpec("move_file", {"source": "a", "destination": "b"}, "m"),
                CallSpec("write_file", {"path": "b/new.txt", "content": "n\n"}, "w"),
                CallSpec("move_file", {"source": "b/sub/y.txt", "destination": "y.txt"}, "m2"),
                CallSpec("write_file", {"path": "b/x.txt", "content": "changed\n", "overwrite": True}, "o"),
            ]
        )
        assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == before


def test_a_stranger_file_in_a_moved_directory_is_still_a_conflict(undoing: DaemonProcess) -> None:
    """Knowing what the move brought does not make the undo careless: a file someone
    adds to the moved directory afterwards refuses the undo, and nothing changes."""
    root = undoing.root
    shutil.rmtree(root)
    root.mkdir()
    (root / "a").mkdir()
    (root / "a/x.txt").write_text("x\n")
    with undoing.client(timeout=60) as c:
        outcome = c.submit(
            [
                CallSpec("move_file", {"source": "a", "destination": "b"}, "m"),
                CallSpec("write_file", {"path": "b/new.txt", "content": "n\n"}, "w"),
            ]
        )
        assert all(r.ok for r in outcome.results)
        (root / "b/stranger.txt").write_text("mine\n")
        after = tree(root)
        (result,) = c.undo(outcome.batch_id).results
    assert not result.ok and result.error.code == "UNDO_CONFLICT", result.content
    assert "b/stranger.txt" in result.content
    assert tree(root) == after


def _a_file_at_the_root(root: Path) -> None:
    (root / "a.txt").write_text("")


def _a_file_two_directories_down(root: Path) -> None:
    (root / "a" / "a").mkdir(parents=True)
    (root / "a" / "a" / "a.txt").write_text("")
    os.chmod(root / "a" / "a" / "a.txt", 0o600)


@pytest.mark.parametrize("make_tree", [_a_file_at_the_root, _a_file_two_directories_down])
def test_a_directory_the_batch_made_and_deleted_then_a_file_written_in_its_place_is_undone(
    undoing: DaemonProcess, make_tree: Callable[[Path], None]
) -> None:
    """Both drawn by the property test: a/a.txt written (making the directory a if it was
    not there), a deleted with everything in it, then a written as a file.

    - From a tree with a/a/a.txt: taking a/a.txt away (it is absent already) made the
      undo look for a directory a, a file by then: the undo failed whole, "Not a
      directory".
    - From a tree with a.txt at the root: the directory a's tree hash was counted stale
      by the later change below it, so the file a's bytes were expected to hash to
      nothing: the undo refused, saying a had changed since the batch."""
    root = undoing.root
    shutil.rmtree(root)
    root.mkdir()
    make_tree(root)
    before = tree(root)
    with undoing.client(timeout=60) as c:
        outcome = c.submit(
            [
                CallSpec("write_file", {"path": "a/a.txt", "content": "", "overwrite": True}, "w1"),
                CallSpec("delete_file", {"path": "a", "recursive": True}, "d"),
                CallSpec("write_file", {"path": "a", "content": "", "overwrite": True}, "w2"),
            ]
        )
        assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
        assert (root / "a").is_file()
        (result,) = c.undo(outcome.batch_id).results
    assert result.ok, result.content
    assert tree(root) == before
