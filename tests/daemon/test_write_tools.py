"""The mutating tools, run in-process on a real filesystem: atomicity, symlinks, modes,
stale files, edits, patches, deletes and moves (the daemon tests run them isolated)."""

from __future__ import annotations

import base64
import os
import stat
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.acls import posix_acl
from tests.conftest import small_tmpfs
from toold_daemon.config import Config
from toold_daemon.config.loading import parse
from toold_daemon.errors import ToolError
from toold_daemon.execution.reads import ReadTracker
from toold_daemon.sandbox import Sandbox, writes
from toold_daemon.tools import ToolContext, ToolOutput
from toold_daemon.tools.builtin import builtin_tools

TOOLS = {tool.name: tool for tool in builtin_tools()}


class Workspace:
    """A root plus one client session's read records, like the executor keeps them."""

    def __init__(self, root: Path, config: Config | None = None) -> None:
        self.root = root
        self.sandbox = Sandbox([root])
        self.config = config or Config()
        self.reads = ReadTracker()

    def call(self, name: str, **arguments: Any) -> ToolOutput:
        tool = TOOLS[name]
        args = msgspec.convert(arguments, tool.args_type)
        tool.validate(args)
        resolved = {raw: self.sandbox.resolve(raw) for raw in tool.paths(args)}
        ctx = ToolContext(
            call_id="c",
            sandbox=self.sandbox,
            config=self.config,
            resolved=resolved,
            reads=self.reads.for_paths("s", [str(p) for p in resolved.values()]),
        )
        output = tool.run(args, ctx)
        self.reads.update("s", output.records)
        return output

    def error(self, name: str, **arguments: Any) -> ToolError:
        with pytest.raises(ToolError) as info:
            self.call(name, **arguments)
        return info.value


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root)


TEXTS = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200)


@given(text=TEXTS, crlf=st.booleans())
def test_write_then_read_round_trips_any_text(tmp_path_factory: pytest.TempPathFactory, text: str, crlf: bool) -> None:
    ws = Workspace(tmp_path_factory.mktemp("rt"))
    content = text.replace("\n", "\r\n") if crlf else text
    ws.call("write_file", path="d/f.txt", content=content)
    assert (ws.root / "d/f.txt").read_bytes() == content.encode()
    read = ws.call("read_file", path="d/f.txt")
    if "\x00" not in content:
        assert read.content == content


@given(data=st.binary(max_size=300))
def test_write_then_read_round_trips_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    ws = Workspace(tmp_path_factory.mktemp("bin"))
    ws.call("write_file", path="blob.bin", content=base64.b64encode(data).decode(), encoding="base64")
    assert (ws.root / "blob.bin").read_bytes() == data
    read = ws.call("read_file", path="blob.bin", encoding="base64")
    assert base64.b64decode(read.content) == data


def test_existing_file_needs_overwrite_and_keeps_its_mode(ws: Workspace) -> None:
    target = ws.root / "f.sh"
    target.write_text("old\n")
    os.chmod(target, 0o750)
    error = ws.error("write_file", path="f.sh", content="new\n")
    assert error.code == "FILE_EXISTS" and "overwrite" in error.message
    assert target.read_text() == "old\n"
    out = ws.call("write_file", path="f.sh", content="new\n", overwrite=True)
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert out.data == {"changes": {"f.sh": "modified"}, "bytes": 4}
    assert "-old" in (out.display or "") and "+new" in (out.display or "")
    assert [p.name for p in ws.root.iterdir()] == ["f.sh"]  # no temp file left


def test_writes_never_follow_a_symlink_out_of_the_root(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("safe")
    (ws.root / "link.txt").symlink_to(outside / "victim.txt")
    (ws.root / "dirlink").symlink_to(outside)
    for path in ("link.txt", "dirlink/victim.txt", "dirlink/new.txt"):
        with pytest.raises(ToolError):
            ws.call("write_file", path=path, content="pwned", overwrite=True)
    assert (outside / "victim.txt").read_text() == "safe"
    assert not (outside / "new.txt").exists()


def test_a_directory_swapped_for_a_symlink_while_writing_never_escapes(ws: Workspace, tmp_path: Path) -> None:
    """A racing thread replaces root/d with a symlink to an outside directory, over and
    over, while write_file writes d/f.txt (validated before the swap, as the planner does)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    real = ws.root / "d"
    real.mkdir()
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            try:
                os.rename(real, ws.root / "d.real")
                os.symlink(outside, real)
                os.unlink(real)
                os.rename(ws.root / "d.real", real)
            except OSError:
                pass

    racer = threading.Thread(target=swap)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # let the racer interleave with the writer often
    racer.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for i in range(20_000):
            try:
                ws.call("write_file", path="d/f.txt", content=str(i), overwrite=True, create_dirs=False)
                outcomes["ok"] += 1
            except ToolError:
                outcomes["refused"] += 1
            if i >= 400 and outcomes["ok"] and outcomes["refused"]:
                break
    finally:
        stop.set()
        racer.join()
        sys.setswitchinterval(switch)
    assert list(outside.iterdir()) == []
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0  # the race really happened both ways


# ---- edit_file ----


def read_then(ws: Workspace, path: str) -> None:
    ws.call("read_file", path=path)


def test_edit_requires_a_read_and_refuses_a_changed_file(ws: Workspace) -> None:
    (ws.root / "f.txt").write_text("a\nb\n")
    error = ws.error("edit_file", path="f.txt", edits=[{"target": "a", "replacement": "A"}])
    assert error.type == "StaleFile" and "not been read" in error.message
    read_then(ws, "f.txt")
    (ws.root / "f.txt").write_text("a\nb\nchanged by someone else\n")
    error = ws.error("edit_file", path="f.txt", edits=[{"target": "a", "replacement": "A"}])
    assert error.type == "StaleFile" and "changed since" in error.message
    read_then(ws, "f.txt")
    ws.call("edit_file", path="f.txt", edits=[{"target": "a\n", "replacement": "A\n"}])
    ws.call("edit_file", path="f.txt", edits=[{"target": "b\n", "replacement": "B\n"}])  # own write refreshed
    assert (ws.root / "f.txt").read_text() == "A\nB\nchanged by someone else\n"


def test_a_ranged_read_counts_until_the_file_changes(ws: Workspace) -> None:
    (ws.root / "f.txt").write_text("1\n2\n3\n")
    ws.call("read_file", path="f.txt", start_line=2, end_line=2)
    ws.call("edit_file", path="f.txt", edits=[{"target": "2", "replacement": "two"}])
    assert (ws.root / "f.txt").read_text() == "1\ntwo\n3\n"


def test_stale_check_can_be_turned_off(root: Path) -> None:
    ws = Workspace(root, parse("[tools.edit]\nrequire_read = false\n"))
    (root / "f.txt").write_text("x\n")
    ws.call("edit_file", path="f.txt", edits=[{"target": "x", "replacement": "y"}])
    assert (root / "f.txt").read_text() == "y\n"


def test_edit_errors_name_the_edit_and_change_nothing(ws: Workspace) -> None:
    original = b"one\ntwo\ntwo\n"
    (ws.root / "f.txt").write_bytes(original)
    read_then(ws, "f.txt")
    missing = ws.error(
        "edit_file", path="f.txt", edits=[{"target": "one", "replacement": "1"}, {"target": "zzz", "replacement": "3"}]
    )
    assert missing.code == "EDIT_TARGET_NOT_FOUND" and missing.details["edit_index"] == 1
    ambiguous = ws.error("edit_file", path="f.txt", edits=[{"target": "two", "replacement": "2"}])
    assert ambiguous.code == "EDIT_TARGET_AMBIGUOUS" and ambiguous.details["count"] == 2
    assert (ws.root / "f.txt").read_bytes() == original
    ws.call("edit_file", path="f.txt", edits=[{"target": "two", "replacement": "2", "occurrence": 2}])
    assert (ws.root / "f.txt").read_bytes() == b"one\ntwo\n2\n"


def test_edit_keeps_crlf_and_bom(ws: Workspace) -> None:
    (ws.root / "w.txt").write_bytes(b"\xef\xbb\xbfline one\r\nline two\r\n")
    read_then(ws, "w.txt")
    ws.call("edit_file", path="w.txt", edits=[{"target": "one\nline", "replacement": "1\nnew\nline"}])
    assert (ws.root / "w.txt").read_bytes() == b"\xef\xbb\xbfline 1\r\nnew\r\nline two\r\n"


@given(st.lists(st.sampled_from(["ab", "cd", "ef"]), min_size=1, max_size=10), st.sampled_from(["ab", "cd", "ef"]))
def test_edit_uniqueness_property(tmp_path_factory: pytest.TempPathFactory, words: list[str], target: str) -> None:
    ws = Workspace(tmp_path_factory.mktemp("e"))
    text = " ".join(words)
    (ws.root / "f.txt").write_text(text)
    read_then(ws, "f.txt")
    count = text.count(target)
    if count == 1:
        ws.call("edit_file", path="f.txt", edits=[{"target": target, "replacement": "XY"}])
        assert (ws.root / "f.txt").read_text() == text.replace(target, "XY")
    else:
        error = ws.error("edit_file", path="f.txt", edits=[{"target": target, "replacement": "XY"}])
        assert error.code == ("EDIT_TARGET_NOT_FOUND" if count == 0 else "EDIT_TARGET_AMBIGUOUS")
        assert (ws.root / "f.txt").read_text() == text


# ---- apply_patch ----


def test_a_patch_whose_third_file_fails_changes_nothing(ws: Workspace) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws.root / name).write_text(f"{name}\n")
        read_then(ws, name)
    patch = "LP1\nF a.txt\nT\nA\n.\nF b.txt\nT\nB\n.\nF new/dir/n.txt\nT\nN\n.\nF c.txt\nR\nmissing\n.\nx\n.\nEND\n"
    error = ws.error("apply_patch", patch=patch)
    assert error.type == "PatchFailed" and "c.txt" in error.message and "not found" in error.message
    assert [(ws.root / n).read_text() for n in ("a.txt", "b.txt", "c.txt")] == ["a.txt\n", "b.txt\n", "c.txt\n"]
    assert not (ws.root / "new").exists()


def _as_nobody(action: Callable[[], str]) -> str:
    """``action``'s answer, run in a forked child that became uid/gid 65534 (so that
    permissions hold: root passes every one)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        answer = "child failed"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            answer = action()
        except BaseException as exc:
            answer = f"child raised {exc!r}"
        finally:
            os.write(write_end, answer.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are root's alone)."""
    with tempfile.TemporaryDirectory() as made:
        os.chmod(made, 0o755)
        yield Path(made)


def test_a_patch_whose_later_step_fails_puts_back_the_files_it_changed(open_tmp: Path) -> None:
    """Staged, then put in place in order: a.txt is updated, then deleting d/b.txt fails
    (d is not writable). The update is put back; the patch changed nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    root = open_tmp / "root"
    (root / "d").mkdir(parents=True)
    (root / "a.txt").write_text("a\n")
    (root / "d/b.txt").write_text("b\n")
    os.chmod(root / "a.txt", 0o640)
    for path in (root, root / "d", root / "a.txt", root / "d/b.txt"):
        os.chown(path, 65534, 65534)
    os.chmod(root / "d", 0o555)

    def patch_as_nobody() -> str:
        ws = Workspace(root)
        read_then(ws, "a.txt")
        read_then(ws, "d/b.txt")
        patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-a\n+A\n*** Delete File: d/b.txt\n*** End Patch\n"
        return ws.error("apply_patch", patch=patch).message

    message = _as_nobody(patch_as_nobody)
    assert message.startswith("Permission denied") and "d/b.txt" in message, message
    assert "in part" not in message  # everything could be put back
    assert (root / "a.txt").read_text() == "a\n" and (root / "d/b.txt").read_text() == "b\n"
    assert stat.S_IMODE(os.stat(root / "a.txt").st_mode) == 0o640  # its mode too
    assert sorted(os.listdir(root)) == ["a.txt", "d"]


#: A POSIX ACL as the kernel stores it: its owner rw, uid 4243 r, its group r, mask r, others nothing.
ACL = posix_acl(owner=6, group=4, other=0, users={4243: 4})
#: File capabilities (CAP_NET_BIND_SERVICE permitted), which new contents must not keep.
CAPABILITY = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)


def dressed(path: Path) -> dict[str, bytes]:
    """Give ``path`` another owner and group, an ACL, a user attribute and file
    capabilities; what a write over it must keep (all but the capabilities)."""
    os.chown(path, 4300, 4242)
    try:
        os.setxattr(path, "system.posix_acl_access", ACL)
        os.setxattr(path, "user.origin", b"https://example.com/f")
        os.setxattr(path, "security.capability", CAPABILITY)
    except OSError as exc:
        pytest.skip(f"this filesystem keeps no such attributes: {exc.strerror}")
    return {name: os.getxattr(path, name) for name in ("system.posix_acl_access", "user.origin")}


def attributes(path: Path) -> tuple[int, int, int, dict[str, bytes]]:
    st = path.stat()
    xattrs = {name: os.getxattr(path, name) for name in os.listxattr(path)}
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), xattrs


def _write(ws: Workspace) -> str:
    ws.call("write_file", path="f.txt", content="new\n", overwrite=True)
    return "f.txt"


def _edit(ws: Workspace) -> str:
    ws.call("edit_file", path="f.txt", edits=[{"target": "old", "replacement": "new"}])
    return "f.txt"


def _patch(ws: Workspace) -> str:
    ws.call("apply_patch", patch="LP1\nF f.txt\nR\nold\n.\nnew\n.\nEND\n")
    return "f.txt"


def _patch_moving(ws: Workspace) -> str:
    patch = "*** Begin Patch\n*** Update File: f.txt\n*** Move to: g.txt\n@@\n-old\n+new\n*** End Patch\n"
    ws.call("apply_patch", patch=patch)
    return "g.txt"


def _move_over(ws: Workspace) -> str:
    (ws.root / "g.txt").write_text("new\n")
    ws.call("move_file", source="g.txt", destination="f.txt", overwrite=True)
    return "f.txt"


#: Each writes "new" over (or from) f.txt, which held "old", and names what it wrote.
WRITES_OVER_A_FILE: dict[str, Callable[[Workspace], str]] = {
    "write_file": _write,
    "edit_file": _edit,
    "apply_patch": _patch,
    "apply_patch, moved": _patch_moving,
    "move_file over another": _move_over,
}


@pytest.mark.parametrize("how", WRITES_OVER_A_FILE)
def test_a_write_keeps_the_group_and_attributes_of_the_file_it_replaces(ws: Workspace, how: str) -> None:
    """A write is a new file renamed over the old: it keeps the old file's owner (the
    writer here is root, who may give it), group, ACL and extended attributes (before,
    the writer's owner and group and none of them), never its file capabilities (the
    kernel drops those when a file is written to)."""
    target = ws.root / "f.txt"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    kept = dressed(target) if how != "move_file over another" else {}
    read_then(ws, "f.txt")
    written = ws.root / WRITES_OVER_A_FILE[how](ws)
    assert written.read_text() == "new\n"
    uid, gid, mode, now = attributes(written)
    if how == "move_file over another":  # a move brings its source as it was: nothing of what it replaced
        assert (uid, gid, now) == (0, 0, {})
        return
    assert (uid, gid, mode) == (4300, 4242, 0o640) and now == kept


def test_a_move_across_filesystems_keeps_its_attributes(ws: Workspace) -> None:
    with small_tmpfs(ws.root / "mnt", "size=1m") as mount:
        source = ws.root / "a.txt"
        source.write_text("across")
        os.chmod(source, 0o640)
        kept = dressed(source)
        ws.call("move_file", source="a.txt", destination="mnt/a.txt")
        uid, gid, mode, now = attributes(mount / "a.txt")
        assert (mount / "a.txt").read_text() == "across" and not source.exists()
        assert (uid, gid, mode) == (4300, 4242, 0o640) and now == kept


def test_patch_applies_across_files_and_refreshes_reads(ws: Workspace) -> None:
    (ws.root / "src").mkdir()
    (ws.root / "src/app.py").write_text("def f():\n    return 1\n")
    (ws.root / "old.txt").write_text("bye\n")
    read_then(ws, "src/app.py")
    read_then(ws, "old.txt")
    patch = (
        "*** Begin Patch\n*** Add File: docs/new.md\n+hi\n*** Update File: src/app.py\n*** Move to: src/main.py\n"
        "@@ def f():\n-    return 1\n+    return 2\n*** Delete File: old.txt\n*** End Patch\n"
    )
    out = ws.call("apply_patch", patch=patch)
    assert out.data == {
        "changes": {"docs/new.md": "created", "src/app.py": "deleted", "src/main.py": "moved", "old.txt": "deleted"}
    }
    assert (ws.root / "docs/new.md").read_text() == "hi\n"
    assert (ws.root / "src/main.py").read_text() == "def f():\n    return 2\n"
    assert not (ws.root / "src/app.py").exists() and not (ws.root / "old.txt").exists()
    ws.call("apply_patch", patch="LP1\nF src/main.py\nR\n    return 2\n.\n    return 3\n.\nEND\n")
    assert "return 3" in (ws.root / "src/main.py").read_text()


def test_patch_refuses_unread_files_and_paths_outside(ws: Workspace) -> None:
    (ws.root / "f.txt").write_text("x\n")
    assert ws.error("apply_patch", patch="LP1\nF f.txt\nT\ny\n.\nEND\n").type == "StaleFile"
    outside = ws.error("apply_patch", patch="LP1\nF ../evil.txt\nT\ny\n.\nEND\n")
    assert outside.type == "SandboxViolation"


# ---- delete_file, move_file ----


def test_delete(ws: Workspace, tmp_path: Path) -> None:
    (ws.root / "d/e").mkdir(parents=True)
    (ws.root / "d/e/f.txt").write_text("x")
    (ws.root / "d/g.txt").write_text("y")
    target = tmp_path / "target.txt"
    target.write_text("keep")
    (ws.root / "d/link").symlink_to(target)
    assert ws.error("delete_file", path="d").code == "IS_A_DIRECTORY"
    assert ws.error("delete_file", path=".").code == "ROOT_ITSELF"
    out = ws.call("delete_file", path="d", recursive=True)
    assert sorted(out.data["deleted"]) == sorted(["d/e/f.txt", "d/e", "d/g.txt", "d/link", "d"])  # type: ignore[index]
    assert not (ws.root / "d").exists() and target.read_text() == "keep"


def test_move(ws: Workspace) -> None:
    (ws.root / "a.txt").write_text("a")
    (ws.root / "b.txt").write_text("b")
    assert ws.error("move_file", source="a.txt", destination="b.txt").code == "FILE_EXISTS"
    ws.call("move_file", source="a.txt", destination="sub/c.txt")
    assert (ws.root / "sub/c.txt").read_text() == "a" and not (ws.root / "a.txt").exists()
    ws.call("move_file", source="sub/c.txt", destination="b.txt", overwrite=True)
    assert (ws.root / "b.txt").read_text() == "a"


def test_move_across_filesystems(ws: Workspace) -> None:
    with small_tmpfs(ws.root / "mnt", "size=1m") as mount:
        (ws.root / "a.txt").write_text("across")
        os.chmod(ws.root / "a.txt", 0o640)
        ws.call("move_file", source="a.txt", destination="mnt/a.txt")
        assert (mount / "a.txt").read_text() == "across" and not (ws.root / "a.txt").exists()
        assert stat.S_IMODE((mount / "a.txt").stat().st_mode) == 0o640
        assert os.stat(mount).st_dev != os.stat(ws.root).st_dev


def test_a_move_across_filesystems_whose_source_stays_leaves_no_copy(
    open_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across filesystems a move copies, then removes the source: when the source cannot be
    removed (its directory is not writable), the copy is taken back, and a file it
    replaced is put back as it was (both were left before)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    root = open_tmp / "root"
    (root / "d").mkdir(parents=True)
    (root / "d/x.txt").write_text("x\n")
    for path in (root, root / "d", root / "d/x.txt"):
        os.chown(path, 65534, 65534)
    os.chmod(root / "d", 0o555)
    with small_tmpfs(root / "mnt", "size=1m,mode=777") as mount:
        (mount / "y.txt").write_text("old\n")
        os.chown(mount / "y.txt", 65534, 65534)
        os.chmod(mount / "y.txt", 0o600)

        def move_as_nobody() -> str:
            ws = Workspace(root)
            fresh = ws.error("move_file", source="d/x.txt", destination="mnt/x.txt").message
            over = ws.error("move_file", source="d/x.txt", destination="mnt/y.txt", overwrite=True).message
            return f"{fresh}|{over}"

        fresh, over = _as_nobody(move_as_nobody).split("|")
        assert fresh == over == "Permission denied: d/x.txt", (fresh, over)
        assert (root / "d/x.txt").read_text() == "x\n"
        assert sorted(os.listdir(mount)) == ["y.txt"]  # no copy, no temp file
        assert (mount / "y.txt").read_text() == "old\n" and stat.S_IMODE((mount / "y.txt").stat().st_mode) == 0o600

        # A replaced file past what is held in memory to put it back: the copy stays
        # beside the source, as a move that failed midway left it before.
        monkeypatch.setattr(writes, "PUT_BACK_MAX_BYTES", 2)
        over_large = _as_nobody(move_as_nobody).split("|")[1]
        assert over_large == "Permission denied: d/x.txt"
        assert (mount / "y.txt").read_text() == "x\n" and (root / "d/x.txt").read_text() == "x\n"


# ---- names as long as a name may be ----

LONGEST_NAMES = ["a" * 251 + ".txt", "日" * 83 + ".txt", "é" * 125 + ".txt"]  # 255, 253, 254 bytes


@pytest.mark.parametrize("name", LONGEST_NAMES, ids=["ascii", "cjk", "latin"])
def test_a_file_whose_name_takes_the_255_bytes_a_name_may_have_can_be_written(ws: Workspace, name: str) -> None:
    """Its temp file's name is cut to fit by bytes; cut by characters (200 of them), it
    went past 255 bytes for a multibyte name and the write failed "File name too long"."""
    assert len(os.fsencode(name)) <= 255
    ws.call("write_file", path=name, content="one\n")
    ws.call("read_file", path=name)
    ws.call("write_file", path=name, content="two\n", overwrite=True)
    ws.call("edit_file", path=name, edits=[{"target": "two", "replacement": "three"}])
    ws.call("apply_patch", patch=f"*** Begin Patch\n*** Update File: {name}\n@@\n-three\n+four\n*** End Patch")
    assert (ws.root / name).read_text() == "four\n"
    assert os.listdir(ws.root) == [name]


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


def test_a_write_over_a_file_too_large_to_read_replaces_it_unread(ws: Workspace) -> None:
    """A write replaces a file whole: it no longer reads the old one first (a diff of a
    5 GB file failed with MemoryError in the worker); past 64 MiB it says so instead."""
    _sparse(ws.root / "huge.log", writes.WHOLE_READ_MAX_BYTES + 1)
    out = ws.call("write_file", path="huge.log", content="fresh\n", overwrite=True)
    assert (ws.root / "huge.log").read_text() == "fresh\n"
    assert "too large to show as a diff" in (out.display or ""), out.display


def test_an_edit_of_a_file_too_large_to_read_is_refused_as_such(ws: Workspace) -> None:
    _sparse(ws.root / "huge.txt", writes.WHOLE_READ_MAX_BYTES + 1)
    error = ws.error("edit_file", path="huge.txt", edits=[{"target": "a", "replacement": "b"}])
    assert error.code == "FILE_TOO_LARGE" and "huge.txt" in error.message
    assert (ws.root / "huge.txt").stat().st_size == writes.WHOLE_READ_MAX_BYTES + 1


def test_a_move_across_filesystems_copies_a_piece_at_a_time(ws: Workspace) -> None:
    """Across filesystems a move copies, then deletes: the copy no longer holds the file
    in memory (a file of gigabytes was read whole first)."""
    with small_tmpfs(ws.root / "mnt", "size=100m") as mount:
        data = os.urandom(1 << 20) * 70  # 70 MiB: more than a tool reads whole
        (ws.root / "big.bin").write_bytes(data)
        ws.call("move_file", source="big.bin", destination="mnt/big.bin")
        assert (mount / "big.bin").read_bytes() == data and not (ws.root / "big.bin").exists()
