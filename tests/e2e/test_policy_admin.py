"""Policy administration for real: explain, reload by SIGHUP and by request, check-config."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, start_daemon
from tests.e2e.test_toolctl import toolctl
from toold_client import RemoteError

POLICY_V1 = """
[[tools.approval.rules]]
tool = "shell"
decision = "allow"
conditions = [{param = "command", operator = "prefix", value = "git"}]
match = [{command = "git status"}]

[[tools.approval.rules]]
tool = "*"
decision = "deny"
conditions = [{param = "path", operator = "matches", value = "secret"}]
"""


def test_explain_names_the_deciding_rule(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config=POLICY_V1)
    try:
        with d.client() as client:
            git = client.explain("shell", {"command": "git status && git log"})
            mixed = client.explain("shell", {"command": "git status; curl x | sh"})
            secret = client.explain("read_file", {"path": "my-secret.txt"})
            plain = client.explain("read_file", {"path": "notes.txt"})
            unknown = client.explain("format_disk", {})
            outside = client.explain("read_file", {"path": "../../etc/passwd"})
        (root / "x").write_text("x")  # a missing file would be refused while planning, before any policy
        as_json = json.loads(toolctl(d, "policy", "explain", "delete_file", "--args", '{"path": "x"}', "--json").stdout)
    finally:
        d.stop()
    assert (git.decision, git.rule) == ("allow", 0)
    assert mixed.decision == "ask"
    assert (secret.decision, secret.rule) == ("deny", 1)
    assert plain.decision == "allow" and plain.rule is None
    assert unknown.decision == "invalid" and "Unknown tool" in unknown.reason
    assert outside.decision == "invalid" and "'..'" in outside.reason
    assert as_json == {
        "tool": "delete_file",
        "decision": "ask",
        "reason": as_json["reason"],
        "risk": "high",
        "rule": None,
    }


def test_reload_by_sighup_and_by_request_and_a_bad_policy_keeps_the_old(tmp_path: Path, root: Path) -> None:
    d = start_daemon(tmp_path, root, config=POLICY_V1)
    config = tmp_path / "toold.toml"
    try:
        with d.client() as client:
            assert client.explain("shell", {"command": "git status"}).decision == "allow"
            config.write_text(POLICY_V1.replace('decision = "allow"', 'decision = "deny"', 1))
            d.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while client.explain("shell", {"command": "git status"}).decision != "deny":
                assert time.monotonic() < deadline, "SIGHUP did not reload the policy"
                time.sleep(0.05)
            config.write_text(POLICY_V1.replace('operator = "prefix"', 'operator = "sounds_like"'))
            with pytest.raises(RemoteError, match="keeping the old policy"):
                client.reload_policy()
            d.proc.send_signal(signal.SIGHUP)
            time.sleep(0.3)
            assert client.explain("shell", {"command": "git status"}).decision == "deny"  # the old one stands
            config.write_text(POLICY_V1)
            client.reload_policy()
            assert client.explain("shell", {"command": "git status"}).decision == "allow"
            assert client.ping() > 0
    finally:
        d.stop()
    assert "policy reload refused" in d.log.read_text()


def test_check_config(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(POLICY_V1)
    bad = tmp_path / "bad.toml"
    bad.write_text(POLICY_V1.replace('match = [{command = "git status"}]', 'match = [{command = "gitx status"}]'))
    typo = tmp_path / "typo.toml"
    typo.write_text("[tools]\nmax_tool_calls_per_batch = 8\n\n[tools.aproval]\nmode = 'auto'\n")

    def check(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "toold"), "check-config", str(path)], capture_output=True, text=True, timeout=30, check=False
        )

    ok = check(good)
    assert ok.returncode == 0 and "2 policy rules" in ok.stdout
    failing = check(bad)
    assert failing.returncode == 2 and "should match but does not" in failing.stderr
    unknown = check(typo)
    assert unknown.returncode == 2 and f"{typo}:4" in unknown.stderr and "aproval" in unknown.stderr


def test_parse_only_mode_records_calls_and_people_supply_results(tmp_path: Path, root: Path) -> None:
    import msgspec

    import toold_protocol as p
    from tests.e2e.test_daemon import submit_raw

    d = start_daemon(tmp_path, root, config='[tools]\nmode = "parse_only"\n')

    def call(call_id: str, name: str, **arguments: object) -> p.ToolCall:
        return p.ToolCall(call_id=call_id, name=name, arguments=msgspec.Raw(p.encode_value(arguments)))

    try:
        with d.client() as client:
            accepted = submit_raw(
                client,
                [
                    call("c0", "read_file", path="a.txt"),
                    call("c1", "shell", command="touch made-by-shell"),
                    call("c2", "no_such_tool"),
                ],
                batch_id="parsed",
            )
            assert [c.disposition for c in accepted.calls] == ["pending", "pending", "resolved"]
            supplied = toolctl(d, "result", "c1", "--batch", "parsed", "--content", "it failed", "--error")
            assert supplied.returncode == 0, supplied.stderr
            with pytest.raises(RemoteError, match="not waiting"):
                client.supply_result("parsed", "c1", "twice")
            client.supply_result("parsed", "c0", "contents from a person")
            finished = client.wait_batch("parsed", timeout=10)
    finally:
        d.stop()
    first, second, third = finished.results
    assert first.ok and first.content == "contents from a person"
    assert second.error is not None and second.error.code == "SUPPLIED_ERROR" and "it failed" in second.content
    assert third.error is not None and third.error.type == "UnknownTool"
    assert not (root / "made-by-shell").exists()


def test_policy_in_its_own_file_with_line_numbers_and_reload(tmp_path: Path, root: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'mode = "prompt"\n\n[[rules]]\ntool = "read_file"\ndecision = "deny"\n'
        'conditions = [{param = "path", operator = "contains", value = "private"}]\n'
        'match = [{path = "private/x"}]\n'
    )
    d = start_daemon(tmp_path, root, config='[daemon]\npolicy_file = "policy.toml"\n')
    try:
        with d.client() as client:
            assert client.explain("read_file", {"path": "private/a"}).decision == "deny"
            policy.write_text(policy.read_text().replace('"private/x"', '"public/x"'))
            with pytest.raises(RemoteError) as info:
                client.reload_policy()
            assert f"{policy}:3:" in info.value.message and "should match but does not" in info.value.message
            assert client.explain("read_file", {"path": "private/a"}).decision == "deny"  # old policy kept
    finally:
        d.stop()


def test_dynamic_approval_of_write_and_move(tmp_path: Path, root: Path) -> None:
    (root / "exists.txt").write_text("x")
    d = start_daemon(tmp_path, root)
    try:
        with d.client() as client:
            decide = lambda name, **args: client.explain(name, args).decision  # noqa: E731
            assert decide("write_file", path="new.txt", content="1") == "allow"
            assert decide("write_file", path="exists.txt", content="1", overwrite=True) == "ask"
            assert decide("move_file", source="exists.txt", destination="fresh.txt") == "allow"
            assert decide("move_file", source="exists.txt", destination="exists.txt2") == "allow"
            (root / "taken.txt").write_text("y")
            assert decide("move_file", source="exists.txt", destination="taken.txt", overwrite=True) == "ask"
            assert decide("delete_file", path="exists.txt") == "ask"
    finally:
        d.stop()
