"""Class V: smaller holes found by the same review.

- What a person approving sees (summary, reasons, arguments) never shows a credential.
- A workspace directory removed and made again is usable at once by commands (the
  zygote confined to the old directory is noticed and replaced).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import DaemonProcess, start_daemon
from toold_client import DENY_ALL

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
