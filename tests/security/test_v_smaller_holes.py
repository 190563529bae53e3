"""Class V: smaller holes found by the same review.

- What a person approving sees (summary, reasons, arguments) never shows a credential.
- A workspace directory removed and made again is usable at once by commands (the
  zygote confined to the old directory is noticed and replaced).
- A zygote or worker (a confined process, running as the client) that claims a huge
  frame gets no memory for it: the daemon reads what is sent, as it is sent.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import tracemalloc
from pathlib import Path

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from toold_client import DENY_ALL
from toold_daemon.isolation.sockets import PeerGone, receive_frame
from toold_daemon.isolation.wire import MAX_FRAME

SECRETS = ["sk-live-4242abcd", "hunter2-pw", "ghp_zzzTOKEN99", "s3cr3t-key-77"]


def test_approvers_see_no_credentials(daemon: DaemonProcess) -> None:
    """Attack: a command carrying credentials waits for approval; whoever watches the
    queue (toolctl pending, watch, the MCP elicitation) must not learn them."""
    command = (
        f"curl -H 'Authorization: Bearer {SECRETS[0]}' https://example.com; "
        f"PASSWORD={SECRETS[1]} ./deploy; GITHUB_TOKEN={SECRETS[2]} gh auth status; "
        f"echo api_key={SECRETS[3]}"
    )
    seen: list[str] = []

    def look(request: object) -> object:
        seen.append(json.dumps([{"summary": i.summary, "reasons": i.reasons, "arguments": i.arguments}
                                for i in request.calls]))  # type: ignore[attr-defined]  # fmt: skip
        return DENY_ALL

    with daemon.client(timeout=30) as c:
        c.call("shell", {"command": command}, on_confirm=look)
        c.call("web_fetch", {"url": "https://example.com/", "headers": {"X-Api-Key": SECRETS[3]}}, on_confirm=look)
    assert seen
    shown = "\n".join(seen)
    for secret in SECRETS:
        assert secret not in shown, secret
    assert "Authorization: Bearer ***" in shown and "PASSWORD=***" in shown


def test_a_workspace_made_anew_is_usable_by_commands(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config='[tools.approval]\nallowlist = ["shell"]\n')
    try:
        with d.client(timeout=30) as c:
            assert c.call("shell", {"command": "echo one > a.txt"}).ok
            shutil.rmtree(root)
            root.mkdir()
            result = c.call("shell", {"command": "echo two > b.txt && cat b.txt"})
        assert result.ok, result.content
        assert (root / "b.txt").read_text() == "two\n"
    finally:
        d.stop()


def test_a_snippet_reads_what_programs_need_of_etc_and_nothing_else(tmp_path: Path, root: Path) -> None:
    """run_code: accounts and the host's name are out of reach; the interpreter, time
    zones, certificates and name resolution still work. A shell command is the user's own
    and keeps /etc."""
    code = (
        "import datetime, json, ssl, socket\n"
        "for p in ['/etc/passwd', '/etc/hostname', '/etc/shadow', '/etc/ssl/certs', '/etc/resolv.conf']:\n"
        "    try:\n"
        "        import os; os.listdir(p) if os.path.isdir(p) else open(p).read(1); print('read', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p)\n"
        "print(ssl.create_default_context().cert_store_stats()['x509_ca'] > 0)"
    )
    d = start_daemon(tmp_path, root, config='[tools.approval]\nallowlist = ["shell", "run_code"]\n')
    try:
        with d.client(timeout=30) as c:
            snippet = c.call("run_code", {"language": "python", "code": code})
            bash = c.call("run_code", {"language": "bash", "code": "cat /etc/hostname /etc/passwd"})
            shell = c.call("shell", {"command": "head -c 4 /etc/passwd"})
    finally:
        d.stop()
    assert snippet.ok, snippet.content
    for path in ("/etc/passwd", "/etc/hostname", "/etc/shadow"):
        assert f"refused {path}" in snippet.content
    assert "read /etc/ssl/certs" in snippet.content and "True" in snippet.content
    assert not bash.ok and "Permission denied" in bash.content
    assert shell.ok and shell.content.startswith("root")


async def test_a_confined_peer_claiming_a_huge_frame_gets_no_memory_for_it() -> None:
    """Attack: a zygote or worker (its process runs as the client) announces a frame just
    under the bound and sends one byte of it, or one far over it. The daemon used to ask
    for the whole announced size at once (``recv(n)`` allocates n bytes): 4 GiB for the
    second. Now the first waits, holding little more than what came, and the second is a
    broken peer at once. Real socket pairs, the daemon's own reader."""
    for claimed, sent in ((MAX_FRAME - 1, b"x"), (2**32 - 1, b"")):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.sendall(claimed.to_bytes(4, "big") + sent)
            tracemalloc.start()
            try:
                with trio.move_on_after(0.3) as waited:
                    with pytest.raises(PeerGone) if claimed > MAX_FRAME else contextlib.nullcontext():
                        await receive_frame(trio.socket.from_stdlib_socket(ours))
                _now, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert waited.cancelled_caught == (claimed <= MAX_FRAME)  # the first still waits for the rest
            assert peak < 1 << 20, f"{peak} bytes held for a frame of {claimed} claimed bytes"
