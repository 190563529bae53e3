"""A write gives a file new contents in a new file that takes the old one's mode. Its
setuid bit (and setgid, where the group may execute) must not come along: the kernel
clears them on any write by a process that may not keep them, and a model's contents in
a setuid program would run with its owner's rights. Written by a root client over another
user's setuid program, they ran as root. File capabilities are dropped the same way."""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DaemonProcess, module_daemon
from tests.e2e.test_undo_trees import CONFIG as EVERYTHING
from toold_client import CallSpec

CAPABILITY = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)  # CAP_NET_BIND_SERVICE


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "setuid", EVERYTHING) as d:
        yield d


def _setuid_program(path: Path, mode: int) -> None:
    path.write_text("#!/bin/sh\necho old\n")
    os.chown(path, 4300, 4300)  # another user's program
    os.chmod(path, mode)
    try:
        os.setxattr(path, "security.capability", CAPABILITY)
    except OSError:
        pass  # a filesystem without capabilities: the mode is what is checked


WRITES = {
    "write_file": lambda name: [
        CallSpec("write_file", {"path": name, "content": "#!/bin/sh\nid\n", "overwrite": True}),
    ],
    "edit_file": lambda name: [
        CallSpec("read_file", {"path": name}),
        CallSpec("edit_file", {"path": name, "edits": [{"target": "echo old", "replacement": "id"}]}),
    ],
    "apply_patch": lambda name: [
        CallSpec("read_file", {"path": name}),
        CallSpec("apply_patch", {"patch": f"LP1\nF {name}\nR\necho old\n.\nid\n.\nEND\n"}),
    ],
}


@pytest.mark.parametrize("tool", WRITES)
@pytest.mark.parametrize("mode", [0o4755, 0o6755, 0o2755])
def test_new_contents_never_keep_setuid_setgid_or_capabilities(daemon: DaemonProcess, tool: str, mode: int) -> None:
    program = daemon.root / f"prog-{tool}-{mode:o}"
    _setuid_program(program, mode)
    with daemon.client(timeout=60) as c:
        outcome = c.submit(WRITES[tool](program.name))
    assert all(r.ok for r in outcome.results), [r.content for r in outcome.results]
    st = program.stat()
    assert "id" in program.read_text()
    assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), oct(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o755  # the rest of its mode is kept
    assert (st.st_uid, st.st_gid) == (4300, 4300)  # and its owner: it never runs as the writer
    assert "security.capability" not in os.listxattr(program)


def test_an_undo_gives_a_setuid_program_back_as_it_was(daemon: DaemonProcess) -> None:
    """What an undo puts back is the old contents: their setuid bit comes back with them."""
    program = daemon.root / "prog-undone"
    _setuid_program(program, 0o4755)
    with daemon.client(timeout=60) as c:
        outcome = c.submit(WRITES["write_file"](program.name))
        (undone,) = c.undo(outcome.batch_id).results
    assert undone.ok, undone.content
    assert stat.S_IMODE(program.stat().st_mode) == 0o4755 and "echo old" in program.read_text()
