"""Class H: robustness bugs an attacker could lean on."""

from __future__ import annotations

from pathlib import Path

import msgspec
import zmq

from tests.conftest import DaemonProcess
from toold_client import APPROVE_ALL
from toold_protocol import Error, decode_daemon_message


def test_delete_file_on_a_symlink_deletes_the_link_never_its_target(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Attack: ask to delete a symlink that points at a file the agent should keep (inside
    the root or outside it)."""
    inside = daemon.root / "keep.txt"
    inside.write_text("keep")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep too")
    (daemon.root / "link-in").symlink_to(inside)
    (daemon.root / "link-out").symlink_to(outside)
    (daemon.root / "dir-link").symlink_to(daemon.root)
    with daemon.client(timeout=30) as c:
        for name in ("link-in", "link-out", "dir-link"):
            c.call("delete_file", {"path": name}, on_confirm=lambda request: APPROVE_ALL)
    assert inside.read_text() == "keep" and outside.read_text() == "keep too"
    assert not (daemon.root / "link-in").is_symlink()
    assert not (daemon.root / "dir-link").is_symlink()


def test_a_deeply_nested_frame_gets_an_error_reply(daemon: DaemonProcess) -> None:
    """Attack: a frame nested 100,000 levels deep, to blow the decoder's stack (and fill
    the log with a traceback per frame)."""
    nested = b"\x91" * 100_000 + b"\xc0"
    frame = msgspec.msgpack.encode({"type": "ping", "id": 7, "padding": msgspec.Raw(nested)})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(daemon.endpoint)
        for _ in range(3):
            sock.send(frame)
            assert sock.poll(10_000), "no reply"
            reply = decode_daemon_message(sock.recv())
            assert isinstance(reply, Error) and "nested too deeply" in reply.message
    finally:
        sock.close()
        ctx.term()
    assert "Traceback" not in daemon.log.read_text() and "RecursionError" not in daemon.log.read_text()
    with daemon.client(timeout=10) as c:
        c.ping()
