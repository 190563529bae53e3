"""Class F: identities and shared names. A client name is a claim, batch ids are
namespaced per uid, and one uid cannot exhaust the daemon for the others."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import toold_protocol as p
from tests.conftest import BIN, DaemonProcess, reachable_daemon, start_daemon
from tests.e2e.test_daemon import submit_raw
from tests.e2e.test_identity import OTHER_UID, as_other_user, remote_code
from toold_client import Client, RemoteError

CONFIG = """
[daemon]
max_running_batches_per_uid = 2

[tools.approval]
allowlist = ["shell"]
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with reachable_daemon(tmp_path_factory.mktemp("identities"), config=CONFIG) as d:
        (d.root / "a.txt").write_text("root's file\n")
        (d.root / "a.txt").chmod(0o644)
        yield d


def test_an_allow_rule_scoped_by_client_name_alone_is_refused(tmp_path: Path) -> None:
    """Attack: call yourself "trusted-agent" (any local process can) to inherit the rule
    the administrator wrote for that agent."""
    policy = tmp_path / "claims.toml"
    policy.write_text('[[tools.approval.rules]]\ntool = "shell"\ndecision = "allow"\nclients = ["trusted-agent"]\n')
    checked = subprocess.run(
        [str(BIN / "toold"), "check-config", str(policy)], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 2, checked.stdout
    assert "client name alone" in checked.stderr


def test_an_allow_rule_with_a_client_name_and_a_uid_needs_both(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    config = (
        '[[tools.approval.rules]]\ntool = "shell"\ndecision = "allow"\n'
        f'clients = ["trusted-agent"]\nuids = [{OTHER_UID}]\n'
    )
    d = start_daemon(tmp_path, root, config=config)
    try:
        with Client(d.endpoint, client_name="trusted-agent") as c:  # the right name, the wrong uid (root)
            assert c.explain("shell", {"command": "true"}).decision == "ask"
    finally:
        d.stop()


def test_another_users_batch_id_neither_blocks_nor_reveals(daemon: DaemonProcess) -> None:
    """Attack: learn which batch ids another user has used, or squat an id they will use,
    by submitting under it."""
    calls = [{"id": "c", "name": "read_file", "arguments": {"path": "a.txt"}}]
    with daemon.client() as owner:
        mine = owner.submit(calls, batch_id="deploy-42")
        assert mine.batch_id == "0:deploy-42"

    def squat(client: Client) -> dict[str, Any]:
        taken = client.submit(calls, batch_id="deploy-42")
        return {
            "batch_id": taken.batch_id,
            "ok": taken.results[0].ok,
            "peek": remote_code(lambda: client.get_batch("0:deploy-42")),
            "again": client.submit(calls, batch_id="deploy-42").batch_id,  # idempotent in their space
        }

    report = as_other_user(daemon.endpoint, squat)
    assert report.get("exception") is None, report
    assert report["batch_id"] == report["again"] == f"{OTHER_UID}:deploy-42"
    assert report["peek"] == "UNKNOWN_BATCH"
    with daemon.client() as owner:  # the owner's record is untouched
        assert owner.get_batch("deploy-42").results[0].content == mine.results[0].content


def test_one_uid_cannot_use_up_the_running_batches_of_everyone(daemon: DaemonProcess) -> None:
    """Attack: keep the daemon busy with long batches so that other users wait."""
    arguments = msgspec.Raw(p.encode_value({"command": "sleep 20"}))
    sleeper = [p.ToolCall(call_id="s", name="shell", arguments=arguments)]
    with daemon.client() as hog:
        accepted = [submit_raw(hog, sleeper) for _ in range(2)]
        with pytest.raises(RemoteError) as refused:
            submit_raw(hog, sleeper)
        assert refused.value.code == "TOO_MANY_BATCHES"
        report = as_other_user(daemon.endpoint, lambda c: {"ok": c.call("read_file", {"path": "a.txt"}).ok})
        assert report == {"ok": True}, report
        for batch in accepted:
            hog.cancel(batch.batch_id)
