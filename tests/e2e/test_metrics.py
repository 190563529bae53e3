"""Metrics: ``toolctl stats`` for people, a Prometheus text file for machines.

The file is read back with the Prometheus client library's own parser (what a scraper
would accept), and its counters must move with real calls through a real daemon.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BIN, reachable_daemon, start_daemon
from tests.e2e.test_identity import as_other_user
from toold_client import APPROVE_ALL, CallSpec, Client


def read_metrics(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample in the file: (name, sorted labels) -> value."""
    samples = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def wait_for(path: Path, predicate: Any, timeout: float = 10.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    deadline = time.monotonic() + timeout
    while True:
        samples = read_metrics(path) if path.exists() else {}
        if predicate(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def calls(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], **labels: str) -> float:
    return sum(
        value
        for (name, sample_labels), value in samples.items()
        if name == "toold_calls_total" and labels.items() <= dict(sample_labels).items()
    )


def test_the_metrics_file_parses_and_its_counters_move_with_calls(tmp_path: Path) -> None:
    metrics = tmp_path / "textfile" / "toold.prom"
    metrics.parent.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    config = f'[daemon]\nmetrics_file = "{metrics}"\nmetrics_interval_seconds = 1\n'
    d = start_daemon(tmp_path, root, config=config)
    try:
        before = wait_for(metrics, lambda s: ("toold_sessions", ()) in s)
        assert calls(before) == 0
        assert before[("toold_start_time_seconds", ())] <= time.time()
        with Client(d.endpoint) as c:
            c.submit([CallSpec("read_file", {"path": "a.txt"}, "a"), CallSpec("read_file", {"path": "a.txt"}, "b")])
            c.submit([CallSpec("read_file", {"path": "missing.txt"}, "m")])
            c.submit([CallSpec("write_file", {"path": "b.txt", "content": "x"}, "w")], on_confirm=lambda r: APPROVE_ALL)
            after = wait_for(metrics, lambda s: calls(s) == 4)
            assert after[("toold_sessions", ())] == 1  # the session above, still open
        assert calls(after, tool="read_file", decision="allow", outcome="ok") == 2
        assert calls(after, tool="read_file", outcome="FILE_NOT_FOUND") == 1
        assert calls(after, tool="write_file", outcome="ok") == 1
        assert after[("toold_call_duration_seconds_count", (("tool", "read_file"),))] == 3
        assert after[("toold_call_duration_seconds_bucket", (("le", "+Inf"), ("tool", "read_file")))] == 3
        assert after[("toold_batches_total", (("state", "finished"),))] == 3
        assert after[("toold_journal_bytes", ())] > 0
        # every reply was read, every record written (or about to be)
        assert after[("toold_waiting_for_clients_bytes", ())] == 0
        assert ("toold_journal_backlog_bytes", ()) in after
        assert after[("toold_journal_pruned_for_space_total", ())] == 0  # nobody is past their share
        assert not any("uid" in dict(labels) for _name, labels in after)  # totals only, no per-user detail
        assert stat.S_IMODE(metrics.stat().st_mode) == 0o644  # node_exporter runs as a user of its own
        assert [p.name for p in metrics.parent.iterdir()] == ["toold.prom"]  # no temporary left behind
    finally:
        d.stop()
    final = read_metrics(metrics)  # written once more as the daemon stopped
    assert calls(final) == 4


def test_stats_show_root_everything_and_another_user_only_their_own(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    with reachable_daemon(tmp_path, config='[tools.approval]\nallowlist = ["shell"]\n') as d:
        (d.root / "shared.txt").write_text("x")
        os.chmod(d.root / "shared.txt", 0o644)
        with Client(d.endpoint) as c:
            for name in ("read_file", "list_directory", "glob"):
                args = {"path": "shared.txt"} if name == "read_file" else {"path": "."}
                if name == "glob":
                    args = {"pattern": "*.txt"}
                c.submit([CallSpec(name, args, "x")])

        def theirs(client: Client) -> dict[str, Any]:
            client.submit([CallSpec("read_file", {"path": "shared.txt"}, "t")])
            stats = client.stats()
            return {
                "scope": stats.scope,
                "calls": sum(c.count for c in stats.calls),
                "sessions": stats.holding["sessions"],
            }

        report = as_other_user(d.endpoint, theirs)
        assert report == {"scope": "own", "calls": 1, "sessions": 1}, report
        with Client(d.endpoint) as c:
            stats = c.stats()
        assert stats.scope == "all"
        assert sum(row.count for row in stats.calls) == 4
        everyone = next(row for row in stats.latency if row.tool == "*")
        assert everyone.count == 4 and everyone.p50_ms <= everyone.p99_ms <= everyone.max_ms


def test_toolctl_stats_for_people_and_as_json(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("x")
    d = start_daemon(tmp_path, root)
    try:
        with Client(d.endpoint) as c:
            c.submit([CallSpec("read_file", {"path": "a.txt"}, "a")])
            c.submit([CallSpec("read_file", {"path": "nope"}, "b")])
        env = {**os.environ, "TOOLD_ENDPOINT": d.endpoint}
        shown = subprocess.run([str(BIN / "toolctl"), "stats"], capture_output=True, text=True, env=env, check=True)
        lines = shown.stdout.splitlines()
        assert any(line.split() == ["read_file", "allow", "ok", "1"] for line in lines), shown.stdout
        assert any(line.split() == ["read_file", "allow", "FILE_NOT_FOUND", "1"] for line in lines), shown.stdout
        assert any(line.startswith("LATENCY (ms)") for line in lines)
        assert any(line.startswith("now: running batches 0") for line in lines)
        raw = subprocess.run(
            [str(BIN / "toolctl"), "stats", "--json"], capture_output=True, text=True, env=env, check=True
        )
        data = json.loads(raw.stdout)
        assert data["scope"] == "all" and sum(row["count"] for row in data["calls"]) == 2
        assert data["batches"] == {"finished": 2}
    finally:
        d.stop()


def test_percentiles_are_nearest_rank() -> None:
    from toold_daemon.records.metrics import Metrics
    from toold_protocol import ToolResult

    metrics = Metrics()
    for ms in (5.0, 1.0, 3.0, 2.0, 4.0, 100.0, 6.0, 7.0, 8.0, 9.0):
        metrics.call_finished(1000, "shell", "allow", ToolResult(call_id="c", ok=True, duration_ms=ms))
    metrics.call_finished(1001, "shell", "allow", ToolResult(call_id="c", ok=True, duration_ms=1000.0))
    mine = metrics.snapshot(1, 1000)
    (shell,) = [row for row in mine.latency if row.tool == "shell"]
    assert (shell.count, shell.p50_ms, shell.p90_ms, shell.p99_ms, shell.max_ms) == (10, 5.0, 9.0, 100.0, 100.0)
    assert metrics.snapshot(2, None).latency[-1].max_ms == 1000.0  # everyone's includes uid 1001


def test_a_metrics_file_that_cannot_be_written_is_logged_and_the_daemon_serves(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    missing = tmp_path / "no-such-dir" / "toold.prom"
    d = start_daemon(tmp_path, root, config=f'[daemon]\nmetrics_file = "{missing}"\nmetrics_interval_seconds = 1\n')
    try:
        time.sleep(2.5)  # a few attempts
        with Client(d.endpoint) as c:
            assert c.ping(timeout=2) < 1
            assert c.stats().scope == "all"
    finally:
        d.stop()
    log = d.log.read_text()
    assert log.count("could not write the metrics file") == 1, log  # said once, not every interval
    assert "Traceback" not in log


def test_relative_audit_and_metrics_paths_are_refused_at_check_config(tmp_path: Path) -> None:
    config = tmp_path / "toold.toml"
    for text, words in (
        ('[daemon]\nmetrics_file = "toold.prom"\n', "metrics_file: 'toold.prom' is not an absolute path"),
        ('[daemon]\naudit_journal_socket = "j.sock"\n', "audit_journal_socket: 'j.sock' is not an absolute path"),
        ('[daemon]\naudit = "loud"\n', "Invalid enum value 'loud'"),
    ):
        config.write_text(text)
        checked = subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)
        assert checked.returncode == 2 and words in checked.stderr, checked.stderr
