"""Confirmations across processes: real daemon, real sessions, real second uid."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

import toold_protocol as p
from tests.conftest import BIN, DaemonProcess, reachable_daemon, start_daemon
from tests.e2e.test_daemon import submit_raw
from tests.e2e.test_identity import OTHER_UID, as_other_user
from toold_client import APPROVE_ALL, DENY_ALL, Client, Decision, RemoteError

WRITE = {"name": "write_file", "arguments": {"path": "w.txt", "content": "new", "overwrite": True}}
READ = {"name": "read_file", "arguments": {"path": "r.txt"}}
DELETE = {"name": "delete_file", "arguments": {"path": "d.txt"}}


@pytest.fixture
def daemon(tmp_path: Path, root: Path) -> Iterator[DaemonProcess]:
    for name in ("r.txt", "w.txt", "d.txt"):
        (root / name).write_text(name)
    d = start_daemon(tmp_path, root, config="[tools.approval]\ntimeout_seconds = 20\n")
    try:
        yield d
    finally:
        d.stop()


def test_one_request_for_the_whole_batch_before_anything_runs(daemon: DaemonProcess) -> None:
    seen: list[Any] = []
    asked: list[p.ConfirmationRequested] = []

    def answer(request: p.ConfirmationRequested) -> Decision:
        asked.append(request)
        return APPROVE_ALL

    with daemon.client() as client:
        outcome = client.submit([READ, WRITE, DELETE], on_event=seen.append, on_confirm=answer)
    assert [r.ok for r in outcome.results] == [True, True, True]
    assert [c.disposition for c in outcome.accepted.calls] == ["run", "confirm", "confirm"]
    assert len(asked) == 1 and [c.call_id for c in asked[0].calls] == ["call_1", "call_2"]
    assert asked[0].calls[1].risk == "high" and asked[0].calls[1].summary == "Delete d.txt"
    first_start = next(i for i, e in enumerate(seen) if isinstance(e, p.CallStarted))
    assert isinstance(seen[0], p.ConfirmationRequested) and first_start > 0  # asked before the read ran
    assert (daemon.root / "w.txt").read_text() == "new" and not (daemon.root / "d.txt").exists()


def test_deny_all_denies_only_the_asked_calls_and_the_batch_goes_on(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        outcome = client.submit([WRITE, READ, DELETE], on_confirm=lambda r: Decision("deny_all", reason="not today"))
    write, read, delete = outcome.results
    assert read.ok
    for denied in (write, delete):
        assert denied.error is not None and denied.error.type == "Denied" and "not today" in denied.content
    assert (daemon.root / "w.txt").read_text() == "w.txt" and (daemon.root / "d.txt").exists()
    assert outcome.state == "finished"


def test_approve_selected(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        outcome = client.submit([WRITE, DELETE], on_confirm=lambda r: Decision("approve_selected", ("call_1",)))
    assert [r.ok for r in outcome.results] == [False, True]
    assert (daemon.root / "w.txt").read_text() == "w.txt" and not (daemon.root / "d.txt").exists()


def test_modified_arguments_are_revalidated(daemon: DaemonProcess) -> None:
    def safer(request: p.ConfirmationRequested) -> Decision:
        return Decision("approve_all", modified_arguments={"call_0": {"path": "safer.txt", "content": "edited"}})

    def escaping(request: p.ConfirmationRequested) -> Decision:
        return Decision("approve_all", modified_arguments={"call_0": {"path": "../../etc/x", "content": "x"}})

    def wrong_type(request: p.ConfirmationRequested) -> Decision:
        return Decision("approve_all", modified_arguments={"call_0": {"path": 42}})

    with daemon.client() as client:
        assert client.submit([WRITE], on_confirm=safer).results[0].ok
        outside = client.submit([WRITE], on_confirm=escaping).results[0]
        bad = client.submit([WRITE], on_confirm=wrong_type).results[0]
    assert (daemon.root / "safer.txt").read_text() == "edited"
    assert (daemon.root / "w.txt").read_text() == "w.txt"
    assert outside.error is not None and outside.error.type == "SandboxViolation"
    assert bad.error is not None and bad.error.type == "BadArgs"


def test_unanswered_requests_time_out_as_denied(tmp_path: Path, root: Path) -> None:
    (root / "w.txt").write_text("w")
    d = start_daemon(tmp_path, root, config="[tools.approval]\ntimeout_seconds = 0.5\n")
    try:
        with d.client() as client:
            started = time.monotonic()
            result = client.call(WRITE["name"], WRITE["arguments"])  # type: ignore[arg-type]
    finally:
        d.stop()
    assert 0.4 < time.monotonic() - started < 10
    # Nobody answered: its own code, not a person's "no"
    assert result.error is not None and result.error.code == "CONFIRMATION_TIMEOUT", result
    assert result.error.type == "Timeout" and "no answer within 0.5s" in result.content
    assert (root / "w.txt").read_text() == "w"


def test_cancel_while_waiting(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        args = msgspec.Raw(p.encode_value(WRITE["arguments"]))
        accepted = submit_raw(client, [p.ToolCall(call_id="c", name="write_file", arguments=args)])
        time.sleep(0.2)
        client.cancel(accepted.batch_id)
        finished = client.wait_batch(accepted.batch_id, timeout=10)
    assert finished.state == "cancelled"
    assert finished.results[0].error is not None and finished.results[0].error.type == "Cancelled"


def test_an_approver_of_the_same_uid_sees_and_answers(daemon: DaemonProcess) -> None:
    with daemon.client() as approver, daemon.client() as agent:
        assert approver.subscribe() == []
        args = msgspec.Raw(p.encode_value(DELETE["arguments"]))
        accepted = submit_raw(agent, [p.ToolCall(call_id="rm", name="delete_file", arguments=args)])
        request = approver.next_confirmation(timeout=5)
        assert request is not None and request.batch_id == accepted.batch_id
        with daemon.client() as late:  # a later approver is shown what is pending
            [replayed] = late.subscribe()
            assert replayed.correlation_id == request.correlation_id
        with daemon.client() as bystander:  # same uid, but neither submitter nor subscribed
            with pytest.raises(RemoteError) as info:
                bystander.confirm(request.correlation_id, APPROVE_ALL)
            assert info.value.code == "NOT_AUTHORIZED"
        approver.confirm(request.correlation_id, APPROVE_ALL)
        with pytest.raises(RemoteError):
            approver.confirm(request.correlation_id, DENY_ALL)  # answered once, for good
        finished = agent.wait_batch(accepted.batch_id, timeout=10)
    assert finished.results[0].ok and not (daemon.root / "d.txt").exists()


@pytest.fixture
def shared_daemon(tmp_path: Path, root: Path) -> Iterator[DaemonProcess]:
    """A daemon whose socket another uid can reach (pytest's tmp dirs are 0700)."""
    (root / "d.txt").write_text("d")
    with reachable_daemon(tmp_path, root=root) as d:
        yield d


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_uid_can_neither_see_nor_answer(shared_daemon: DaemonProcess) -> None:
    daemon = shared_daemon
    with daemon.client() as agent:
        args = msgspec.Raw(p.encode_value(DELETE["arguments"]))
        accepted = submit_raw(agent, [p.ToolCall(call_id="rm", name="delete_file", arguments=args)])
        pending = [e for e in agent.subscribe() if e.batch_id == accepted.batch_id]
        request = pending[0] if pending else agent.next_confirmation(timeout=10)
        assert request is not None and request.batch_id == accepted.batch_id

        def act(client: Client) -> dict[str, Any]:
            pending = client.subscribe()
            try:
                client.confirm(request.correlation_id, APPROVE_ALL)
                code = "accepted"
            except RemoteError as exc:
                code = exc.code
            return {"pending": len(pending), "code": code, "uid": client.hello().identity.uid}

        report = as_other_user(daemon.endpoint, act)
        assert report == {"pending": 0, "code": "NOT_AUTHORIZED", "uid": OTHER_UID}, report
        assert (daemon.root / "d.txt").exists()  # nothing changed
        agent.confirm(request.correlation_id, DENY_ALL)
        finished = agent.wait_batch(accepted.batch_id, timeout=10)
    assert finished.results[0].error is not None and finished.results[0].error.type == "Denied"


def test_correlation_ids_are_unique_under_concurrency(daemon: DaemonProcess) -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def agent() -> None:
        with daemon.client() as client:
            for _ in range(5):

                def answer(request: p.ConfirmationRequested) -> Decision:
                    with lock:
                        ids.append(request.correlation_id)
                    return DENY_ALL

                client.submit([WRITE, DELETE], on_confirm=answer)

    threads = [threading.Thread(target=agent) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 30 and len(set(ids)) == 30


def test_allow_for_this_session_is_narrow(daemon: DaemonProcess) -> None:
    asked: list[str] = []

    def remember(request: p.ConfirmationRequested) -> Decision:
        asked.extend(c.summary for c in request.calls)
        return Decision("approve_all", remember_for_session=True)

    with daemon.client() as client:
        assert client.submit([WRITE], on_confirm=remember).results[0].ok
        again = client.submit([WRITE], on_confirm=lambda r: DENY_ALL)  # same tool, same path: granted
        other = client.submit(
            [{"name": "write_file", "arguments": {"path": "r.txt", "content": "x", "overwrite": True}}],
            on_confirm=lambda r: DENY_ALL,
        )
    with daemon.client() as fresh:  # a grant lives only in its session
        elsewhere = fresh.submit([WRITE], on_confirm=lambda r: DENY_ALL)
    assert again.results[0].ok and [c.disposition for c in again.accepted.calls] == ["run"]
    assert not other.results[0].ok and not elsewhere.results[0].ok
    assert len(asked) == 1


def toolctl(daemon: DaemonProcess, *args: str, wait: bool = True) -> subprocess.Popen[str]:
    env = {**os.environ, "TOOLD_ENDPOINT": daemon.endpoint}
    proc = subprocess.Popen(
        [str(BIN / "toolctl"), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if wait:
        proc.wait(timeout=30)
    return proc


def test_toolctl_yes_no_pending_and_approve(daemon: DaemonProcess) -> None:
    write = json.dumps(WRITE["arguments"])
    denied = toolctl(daemon, "call", "write_file", "--args", write, "--no")
    assert denied.returncode == 1
    assert "Denied" in denied.stdout.read() + denied.stderr.read()  # type: ignore[union-attr,operator]
    approved = toolctl(daemon, "call", "write_file", "--args", write, "--yes")
    assert approved.returncode == 0
    (daemon.root / "w.txt").write_text("again")
    waiting = toolctl(daemon, "call", "delete_file", "--args", json.dumps(DELETE["arguments"]), wait=False)
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while not rows and time.monotonic() < deadline:
        listing = toolctl(daemon, "pending", "--json")
        rows = json.loads(listing.stdout.read())  # type: ignore[union-attr]
    assert rows and rows[0]["calls"] == [
        {
            "call_id": "call_0",
            "tool": "delete_file",
            "summary": "Delete d.txt",
            "risk": "high",
            "reasons": ["delete_file has side effects"],
        }
    ]
    assert toolctl(daemon, "approve", rows[0]["request_id"]).returncode == 0
    assert waiting.wait(timeout=30) == 0, waiting.stderr.read()  # type: ignore[union-attr]
    assert "waiting for approval" in waiting.stderr.read()  # type: ignore[union-attr]
    assert not (daemon.root / "d.txt").exists()


def test_confirmation_shows_the_diff_of_edits_and_patches(daemon: DaemonProcess) -> None:
    (daemon.root / "code.py").write_text("x = 1\ny = 2\n")
    requests: list[p.ConfirmationRequested] = []

    def look(request: p.ConfirmationRequested) -> Decision:
        requests.append(request)
        return DENY_ALL

    with daemon.client() as client:
        client.submit(
            [
                {"name": "read_file", "arguments": {"path": "code.py"}},
                {
                    "name": "edit_file",
                    "arguments": {"path": "code.py", "edits": [{"target": "x = 1", "replacement": "x = 10"}]},
                },
                {"name": "apply_patch", "arguments": {"patch": "LP1\nF code.py\nR\ny = 2\n.\ny = 20\n.\nEND\n"}},
                WRITE,
                {
                    "name": "edit_file",
                    "arguments": {"path": "code.py", "edits": [{"target": "nope", "replacement": "z"}]},
                },
            ],
            on_confirm=look,
        )
    [request] = requests
    edit, patch, write, broken = request.calls
    assert edit.diff is not None and "-x = 1\n+x = 10\n" in edit.diff
    assert patch.diff is not None and "-y = 2\n+y = 20\n" in patch.diff
    assert write.diff is not None and "-w.txt" in write.diff and "+new" in write.diff
    assert broken.diff is not None and "no preview" in broken.diff and "not found" in broken.diff
    assert (daemon.root / "code.py").read_text() == "x = 1\ny = 2\n"  # previews change nothing


def test_toolctl_approval_timeout_overrides_the_daemons(daemon: DaemonProcess) -> None:
    started = time.monotonic()
    waited = toolctl(
        daemon, "call", "delete_file", "--args", json.dumps(DELETE["arguments"]), "--approval-timeout", "0.5"
    )
    assert waited.returncode == 1 and time.monotonic() - started < 10  # the daemon's own timeout is 20 s
    assert "no answer within 0.5s" in waited.stdout.read() + waited.stderr.read()  # type: ignore[union-attr,operator]
    assert (daemon.root / "d.txt").exists()
