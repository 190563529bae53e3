"""Background commands (``shell`` with ``background: true``) and the ``shell_jobs`` view.

A background job is an isolated child like any other; the call returns at once with
the job id and the runner keeps reading the child's output into a bounded buffer (the
first and the last ``keep`` bytes). Jobs belong to a uid: only that uid lists, reads or
kills them. Every job is killed (group and escapees) when the daemon stops.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec


class Job(msgspec.Struct):
    job_id: str
    uid: int
    command: str
    pid: int
    started: float = msgspec.field(default_factory=time.time)
    exit_code: int | None = None
    state: str = "running"  # running, exited, killed
    head: str = ""
    tail: str = ""
    total: int = 0
    kill: Callable[[], None] | None = None
    #: Once it has ended: what a command's result says of its connections (``network``,
    #: ``network_omitted``), empty without any.
    network: dict[str, Any] = msgspec.field(default_factory=dict)

    def add_output(self, text: str, keep: int) -> None:
        self.total += len(text)
        if len(self.head) < keep:
            room = keep - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail = (self.tail + text)[-keep:]

    def output(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        if self.tail and omitted > 0:
            return f"{self.head}\n[... {omitted} characters omitted]\n{self.tail}"
        return self.head + self.tail


class Jobs:
    """Thread-safe: ``shell_jobs`` runs on a worker thread, the readers on the event loop."""

    def __init__(self, max_jobs_per_uid: int = 16) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)
        self.max_jobs_per_uid = max_jobs_per_uid

    def add(self, uid: int, command: str, pid: int) -> Job:
        with self._lock:
            running = [j for j in self._jobs.values() if j.uid == uid and j.state == "running"]
            if len(running) >= self.max_jobs_per_uid:
                raise ValueError(f"uid {uid} already has {len(running)} background jobs running")
            job = Job(job_id=f"job_{next(self._ids)}", uid=uid, command=command, pid=pid)
            self._jobs[job.job_id] = job
            finished = [j for j in self._jobs.values() if j.state != "running"]
            for old in finished[:-100]:  # keep the last hundred finished jobs
                del self._jobs[old.job_id]
            return job

    def of(self, uid: int) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if j.uid == uid]

    def get(self, uid: int, job_id: str) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return job if job is not None and job.uid == uid else None

    def any_running(self) -> bool:
        with self._lock:
            return any(j.state == "running" for j in self._jobs.values())

    def running(self) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if j.state == "running"]
