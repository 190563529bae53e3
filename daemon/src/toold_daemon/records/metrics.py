"""What the daemon has done since it started, for people (``toolctl stats``) and machines.

Counted here: calls by uid, tool, decision and outcome (``ok`` or the error code),
batches by state, and how long calls took (cumulative histogram buckets per tool for
Prometheus; the last ``RECENT`` durations for percentiles). What the daemon holds right
now (running batches, sessions, workers, waiting confirmations, the journal's size) is
asked of the service when a snapshot is taken, so it is never stale.

Machines get the Prometheus text format, written by the Prometheus project's own client
library into ``[daemon] metrics_file`` for node_exporter's textfile collector (the usual
way for a local daemon without a TCP port of its own). Per-uid detail stays out of that
file: it holds totals only.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from toold_protocol import CallCount, Latency, Stats, ToolResult

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the duration histogram's buckets.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Durations kept for percentiles (the most recent calls, every uid).
RECENT = 10_000


class Holding(msgspec.Struct):
    """What the daemon holds at the moment of a snapshot (some per uid)."""

    running_batches: dict[int, int] = msgspec.field(default_factory=dict)
    sessions: dict[int, int] = msgspec.field(default_factory=dict)
    confirmations_waiting: dict[int, int] = msgspec.field(default_factory=dict)
    workers: int = 0
    zygotes: int = 0
    journal_bytes: int = 0
    audit_dropped: int = 0
    #: Bytes of replies waiting for each uid's clients (not yet read).
    waiting_for_clients: dict[int, int] = msgspec.field(default_factory=dict)
    #: Bytes of results queued for the journal's thread, not yet written.
    journal_backlog_bytes: int = 0
    #: Batches pruned since the start because their uid was past its share of the journal.
    journal_pruned_for_space: int = 0


class _Durations(msgspec.Struct):
    buckets: list[int] = msgspec.field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    count: int = 0


class Metrics:
    def __init__(self, holding: Callable[[], Holding] | None = None) -> None:
        self.started = time.time()
        self.holding: Callable[[], Holding] = holding or Holding
        self.calls: collections.Counter[tuple[int, str, str, str]] = collections.Counter()
        self.batches: collections.Counter[tuple[int, str]] = collections.Counter()
        self._durations: dict[str, _Durations] = {}
        self._recent: collections.deque[tuple[int, str, float]] = collections.deque(maxlen=RECENT)

    def call_finished(self, uid: int, tool: str, decision: str, result: ToolResult) -> None:
        outcome = "ok" if result.ok or result.error is None else result.error.code
        self.calls[(uid, tool, decision, outcome)] += 1
        seconds = result.duration_ms / 1000
        durations = self._durations.get(tool)
        if durations is None:
            durations = self._durations[tool] = _Durations()
        durations.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        durations.total += seconds
        durations.count += 1
        self._recent.append((uid, tool, result.duration_ms))

    def batch_finished(self, uid: int, state: str) -> None:
        self.batches[(uid, state)] += 1

    # ------------------------------------------------------------------ for people

    def snapshot(self, request_id: int, uid: int | None) -> Stats:
        """``toolctl stats``: everything (``uid`` None) or one uid's calls and holdings;
        the daemon-wide counts (workers, zygotes, the journal) are everyone's."""
        calls: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for (owner, tool, decision, outcome), count in self.calls.items():
            if uid is None or owner == uid:
                calls[(tool, decision, outcome)] += count
        batches: collections.Counter[str] = collections.Counter()
        for (owner, state), count in self.batches.items():
            if uid is None or owner == uid:
                batches[state] += count
        by_tool: dict[str, list[float]] = collections.defaultdict(list)
        for owner, tool, ms in self._recent:
            if uid is None or owner == uid:
                by_tool[tool].append(ms)
                by_tool["*"].append(ms)
        holding = self.holding()

        def held(counts: dict[int, int]) -> int:
            return sum(counts.values()) if uid is None else counts.get(uid, 0)

        return Stats(
            id=request_id,
            scope="all" if uid is None else "own",
            since=self.started,
            calls=[CallCount(tool=t, decision=d, outcome=o, count=n) for (t, d, o), n in sorted(calls.items())],
            batches=dict(sorted(batches.items())),
            latency=[_latency(tool, sorted(values)) for tool, values in sorted(by_tool.items())],
            holding={
                "running_batches": held(holding.running_batches),
                "sessions": held(holding.sessions),
                "confirmations_waiting": held(holding.confirmations_waiting),
                "workers": holding.workers,
                "zygotes": holding.zygotes,
                "journal_bytes": holding.journal_bytes,
                "audit_records_dropped": holding.audit_dropped,
                "waiting_for_clients_bytes": held(holding.waiting_for_clients),
            },
        )

    # ------------------------------------------------------------------ for machines

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (totals, no uid). The library is
        imported here, when a metrics file is asked for (18 ms of start-up otherwise)."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return generate_latest(registry)

    def write_file(self, path: Path, text: bytes | None = None) -> None:
        """Replace ``path`` atomically (a reader never sees half a file), readable by
        all: node_exporter runs as a user of its own."""
        text = self.exposition() if text is None else text
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text)
                os.fchmod(f.fileno(), 0o644)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def _latency(tool: str, ordered: list[float]) -> Latency:
    def at(q: float) -> float:  # nearest rank: the smallest value with q of them at or below it
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 2)

    return Latency(tool=tool, count=len(ordered), p50_ms=at(0.5), p90_ms=at(0.9), p99_ms=at(0.99), max_ms=at(1.0))


class _Collector:
    """Reads ``Metrics`` when the registry renders, so there is one set of numbers (a
    collector is anything with ``collect``)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        m = self.metrics
        calls = CounterMetricFamily(
            "toold_calls",
            "Tool calls that ended, by tool, policy decision and outcome",
            labels=["tool", "decision", "outcome"],
        )
        totals: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for (_uid, tool, decision, outcome), count in m.calls.items():
            totals[(tool, decision, outcome)] += count
        for labels, count in sorted(totals.items()):
            calls.add_metric(list(labels), count)
        yield calls
        batches = CounterMetricFamily("toold_batches", "Batches that ended, by state", labels=["state"])
        states: collections.Counter[str] = collections.Counter()
        for (_uid, state), count in m.batches.items():
            states[state] += count
        for state, count in sorted(states.items()):
            batches.add_metric([state], count)
        yield batches
        durations = HistogramMetricFamily(
            "toold_call_duration_seconds", "How long tool calls took, by tool", labels=["tool"]
        )
        for tool, d in sorted(m._durations.items()):
            cumulative, running = [], 0
            for bound, count in zip([*map(str, BUCKETS), "+Inf"], d.buckets, strict=True):
                running += count
                cumulative.append((bound, running))
            durations.add_metric([tool], cumulative, sum_value=d.total)
        yield durations
        holding = m.holding()
        yield CounterMetricFamily(
            "toold_journal_pruned_for_space",
            "Batches pruned from the journal because their uid was past max_bytes_per_uid",
            value=holding.journal_pruned_for_space,
        )
        for name, value, text in (
            ("toold_running_batches", sum(holding.running_batches.values()), "Batches running or waiting now"),
            ("toold_sessions", sum(holding.sessions.values()), "Client sessions open now"),
            (
                "toold_confirmations_waiting",
                sum(holding.confirmations_waiting.values()),
                "Questions waiting for a person",
            ),
            ("toold_workers", holding.workers, "Confined tool workers alive"),
            ("toold_zygotes", holding.zygotes, "Command zygotes alive"),
            ("toold_journal_bytes", holding.journal_bytes, "Size of the journal's files"),
            (
                "toold_journal_backlog_bytes",
                holding.journal_backlog_bytes,
                "Bytes of results queued for the journal, not yet written",
            ),
            (
                "toold_waiting_for_clients_bytes",
                sum(holding.waiting_for_clients.values()),
                "Bytes of replies waiting for clients to read them",
            ),
            ("toold_start_time_seconds", m.started, "When the daemon started (Unix time)"),
        ):
            yield GaugeMetricFamily(name, text, value=value)
        yield CounterMetricFamily(
            "toold_audit_records_dropped", "Audit records the system journal did not take", value=holding.audit_dropped
        )


async def write_metrics_forever(metrics: Metrics, path: Path, every: float) -> None:
    """Replace ``path`` now and every ``every`` seconds, and once more when the daemon
    stops. The text is made on the event loop (where the numbers change), written on a
    thread; a write that fails is logged once until one succeeds again."""
    failing = False
    try:
        while True:
            try:
                await trio.to_thread.run_sync(metrics.write_file, path, metrics.exposition())
                failing = False
            except OSError as exc:
                if not failing:
                    log.warning("could not write the metrics file %s: %s", path, exc.strerror or exc)
                failing = True
            await trio.sleep(every)
    finally:
        with contextlib.suppress(OSError):
            metrics.write_file(path)
