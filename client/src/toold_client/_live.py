"""``toolctl call`` and ``batch`` on a terminal: a running call's output as it comes, and
a progress line while a call runs without a word.

Only on a terminal: piped output stays exactly the result's content, printed once at
the end. Output from the daemon is the model's and the workspace's, so it is shown
sanitized (no escape sequences); the progress line lives on stderr and is cleared
before any output is written, so the two never mix on one line.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from toold_protocol import CallFinished, CallStarted, DaemonMessage, OutputChunk, sanitize_for_terminal

#: A call silent this long gets a progress line (seconds).
QUIET_SECONDS = 1.0


class Live:
    """An ``on_event`` handler that streams output, and a ticker for the progress line."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.streamed: set[str] = set()  # call ids whose output was shown as it came
        self._lock = threading.Lock()
        self._running: dict[str, tuple[str, float]] = {}  # call id -> (tool, started)
        self._last_output = time.monotonic()
        self._line_shown = False
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> Live:
        self._ticker.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._ticker.join()
        with self._lock:
            self._clear_line()

    def __call__(self, event: DaemonMessage) -> None:
        with self._lock:
            if isinstance(event, CallStarted):
                self._running[event.call_id] = (event.name, time.monotonic())
            elif isinstance(event, OutputChunk):
                self._clear_line()
                stream = self.err if event.stream == "stderr" else self.out
                stream.write(sanitize_for_terminal(event.data))
                stream.flush()
                self.streamed.add(event.call_id)
                self._last_output = time.monotonic()
            elif isinstance(event, CallFinished):
                self._running.pop(event.result.call_id, None)
                self._clear_line()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                now = time.monotonic()
                if not self._running or now - self._last_output < QUIET_SECONDS:
                    continue
                shown = ", ".join(
                    f"{sanitize_for_terminal(name)} {now - started:.0f}s" for name, started in self._running.values()
                )
                self.err.write(f"\r\x1b[2K… running: {shown[:200]}")
                self.err.flush()
                self._line_shown = True

    def _clear_line(self) -> None:
        if self._line_shown:
            self.err.write("\r\x1b[2K")
            self.err.flush()
            self._line_shown = False
