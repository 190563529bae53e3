"""``toolctl watch``: a terminal view for approvers.

Live batches of the watcher's uid (or approver groups) with each call's state, the
confirmation requests waiting for an answer (tool, summary, risk in colour, diff) and
the last lines of output of running calls, and the latest connections of MCP servers
(polled from the journal every few seconds). Keys: ``a`` approve all, ``d`` deny all,
``p`` pick calls (type ids, Enter), ``q`` quit. Everything from the daemon is passed
through ``sanitize_for_terminal`` before it reaches the screen.
"""

from __future__ import annotations

import collections
import os
import select
import shutil
import sys
import termios
import tty
from dataclasses import dataclass, field
from typing import TextIO

from toold_protocol import (
    BatchFinished,
    BatchStatus,
    CallFinished,
    CallStarted,
    ConfirmationRequested,
    DaemonMessage,
    OutputChunk,
    ServerConnection,
    sanitize_for_terminal,
)

from ._client import APPROVE_ALL, Client, Decision
from ._connections import connection_lines, server_connection_line
from ._errors import RemoteError

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
RISK_COLOURS = {"low": "\x1b[32m", "medium": "\x1b[33m", "high": "\x1b[31m"}
RESET, BOLD, DIM = "\x1b[0m", "\x1b[1m", "\x1b[2m"
OUTPUT_LINES = 1000  # kept per batch, for scrolling back
OUTPUT_SHOWN = 50  # rendered at a time
BATCHES_SHOWN = 6
TODOS_SHOWN = 20
CONNECTIONS_SHOWN = 5
SERVER_CONNECTIONS_EVERY = 20  # screen ticks (of ~0.1 s) between two looks at the servers' connections
TODO_MARKS = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]", "cancelled": "[-]"}


@dataclass
class CallView:
    call_id: str
    name: str
    summary: str
    state: str = "pending"  # pending, running, ok, error, denied
    note: str = ""
    awaiting_result: bool = False  # parse-only: a person supplies the result
    connections: list[str] = field(default_factory=list)  # through the egress proxy, when it finished


@dataclass
class BatchView:
    batch_id: str
    state: str
    calls: list[CallView]
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES))
    partial: str = ""


class WatchState:
    """What the screen shows, updated from daemon messages (no I/O: testable alone)."""

    def __init__(self) -> None:
        self.batches: collections.OrderedDict[str, BatchView] = collections.OrderedDict()
        self.requests: list[ConfirmationRequested] = []
        self.ticks = 0
        self.status = ""
        #: Lines scrolled back from the end of the output shown; 0 follows new output.
        self.scrolled_back = 0
        #: The todo list as the latest write_todos result left it: (batch id, todos).
        self.todos: tuple[str, list[dict[str, object]]] | None = None
        #: The newest connections of MCP servers (they belong to no batch), from the journal.
        self.server_connections: list[ServerConnection] = []

    def apply(self, message: DaemonMessage) -> None:
        match message:
            case BatchStatus():
                calls = [
                    CallView(c.call_id, c.name, c.summary, awaiting_result=c.disposition == "pending")
                    for c in message.calls
                ]
                for view, planned in zip(calls, message.calls, strict=True):
                    if planned.result is not None:
                        view.state, view.note = _finished_state(planned.result.ok, planned.result.error)
                self.batches[message.batch_id] = BatchView(message.batch_id, message.state, calls)
                while len(self.batches) > 50:
                    self.batches.popitem(last=False)
            case ConfirmationRequested():
                self.requests.append(message)
                if message.batch_id in self.batches:
                    self.batches[message.batch_id].state = "awaiting_confirmation"
            case CallStarted():
                started = self._call(message.batch_id, message.call_id)
                if started is not None:
                    started.state = "running"
                    self.batches[message.batch_id].state = "running"
                self._drop_requests_of(message.batch_id)
            case OutputChunk():
                batch = self.batches.get(message.batch_id)
                if batch is not None:
                    text = batch.partial + message.data
                    *lines, batch.partial = text.split("\n")
                    batch.output.extend(lines)
                    if self.scrolled_back and batch is self._output_batch():
                        # Scrolled up: the view stays on the lines being read.
                        self.scrolled_back = min(self.scrolled_back + len(lines), self._max_scroll())
            case CallFinished():
                batch = self.batches.get(message.batch_id)
                if batch is not None and message.index < len(batch.calls):
                    result = message.result
                    batch.calls[message.index].state, batch.calls[message.index].note = _finished_state(
                        result.ok, result.error
                    )
                    batch.calls[message.index].awaiting_result = False
                    batch.calls[message.index].connections = connection_lines(result)[:CONNECTIONS_SHOWN]
                    self._keep_todos(message.batch_id, batch.calls[message.index].name, message.result.data)
                self._drop_requests_of(message.batch_id)
            case BatchFinished():
                batch = self.batches.get(message.batch_id)
                if batch is not None:
                    batch.state = message.state
                self._drop_requests_of(message.batch_id)
            case _:
                pass

    def _keep_todos(self, batch_id: str, name: str, data: object) -> None:
        todos = data.get("todos") if isinstance(data, dict) else None
        if name == "write_todos" and isinstance(todos, list):
            self.todos = (batch_id, [t for t in todos if isinstance(t, dict)][:TODOS_SHOWN])

    def _call(self, batch_id: str, call_id: str) -> CallView | None:
        batch = self.batches.get(batch_id)
        return next((c for c in batch.calls if c.call_id == call_id), None) if batch else None

    def _output_batch(self) -> BatchView | None:
        """The batch whose output is shown: the newest one with output."""
        return next((b for b in reversed(self.batches.values()) if b.output), None)

    def _max_scroll(self) -> int:
        batch = self._output_batch()
        return max(0, len(batch.output) - OUTPUT_SHOWN) if batch is not None else 0

    def scroll(self, lines: int) -> None:
        """Positive: back (up) through the kept output; negative: forward. Reaching the
        end follows new output again."""
        self.scrolled_back = max(0, min(self.scrolled_back + lines, self._max_scroll()))

    def _drop_requests_of(self, batch_id: str) -> None:
        self.requests = [r for r in self.requests if r.batch_id != batch_id]

    def render(self, width: int, height: int) -> list[str]:
        """The screen as lines (with colour escapes of our own; daemon text sanitized)."""
        s = sanitize_for_terminal
        lines = [
            f"{BOLD}toold watch{RESET}  a: approve all  d: deny all  p: pick calls  k/j: scroll  G: follow  "
            f"q: quit   {s(self.status)}"
        ]
        spinner = SPINNER[self.ticks % len(SPINNER)]
        for batch in list(self.batches.values())[-BATCHES_SHOWN:]:
            lines.append(f"{BOLD}batch {s(batch.batch_id)}{RESET} [{s(batch.state)}]")
            for call in batch.calls:
                glyph = {"pending": "·", "running": spinner, "ok": "✓", "error": "✗", "denied": "⊘"}[call.state]
                note = f" — {s(call.note)}" if call.note else ""
                lines.append(f"  {glyph} {s(call.call_id)} {s(call.name)}: {s(call.summary)}{note}")
                lines.extend(f"      {s(connection)}" for connection in call.connections)
            for call in batch.calls:
                if call.awaiting_result:
                    lines.append(
                        f"    waiting for its result: toolctl result {s(call.call_id)} --batch {s(batch.batch_id)} "
                        "--content TEXT [--error]"
                    )
        if self.todos is not None:
            batch_id, todos = self.todos
            lines.append(f"{BOLD}todos{RESET} (from batch {s(batch_id)})")
            lines += [
                f"  {TODO_MARKS.get(str(t.get('status')), '[?]')} {s(str(t.get('id')))}: {s(str(t.get('task')))}"
                for t in todos
            ]
        if self.server_connections:
            lines.append(f"{BOLD}MCP servers' connections{RESET} (newest first)")
            lines += [f"  {s(server_connection_line(c))}" for c in self.server_connections]
        if self.requests:
            request = self.requests[0]
            lines.append("")
            lines.append(
                f"{BOLD}APPROVAL {s(request.correlation_id)}{RESET} for batch {s(request.batch_id)} "
                f"({request.expires_in_ms // 1000}s to answer; {len(self.requests)} waiting)"
            )
            for item in request.calls:
                colour = RISK_COLOURS.get(item.risk, "")
                lines.append(f"  {colour}[{item.risk}]{RESET} {s(item.call_id)} {s(item.name)}: {s(item.summary)}")
                lines.extend(f"      {s(reason)}" for reason in item.reasons)
                for diff_line in (item.diff or "").splitlines()[:20]:
                    colour = (
                        "\x1b[32m" if diff_line.startswith("+") else "\x1b[31m" if diff_line.startswith("-") else ""
                    )
                    lines.append(f"      {colour}{s(diff_line)}{RESET}")
        lines += self._output_lines(height - len(lines))
        return [line[: width * 3] for line in lines[:height]]

    def _output_lines(self, room: int) -> list[str]:
        """The shown batch's output, at most OUTPUT_SHOWN lines and what the screen has
        room for, ending ``scrolled_back`` lines before the newest."""
        s = sanitize_for_terminal
        shown = self._output_batch()
        if shown is None or room < 2:
            return []
        size = min(OUTPUT_SHOWN, room - 1)
        end = len(shown.output) - self.scrolled_back
        window = list(shown.output)[max(0, end - size) : end]
        where = "following" if not self.scrolled_back else f"{self.scrolled_back} lines back (G: follow)"
        return [
            f"{BOLD}output of batch {s(shown.batch_id)}{RESET} — {where}",
            *(f"    {DIM}│ {s(line)}{RESET}" for line in window),
        ]


def _finished_state(ok: bool, error: object) -> tuple[str, str]:
    if ok:
        return "ok", ""
    kind = getattr(error, "type", "")
    message = str(getattr(error, "message", ""))[:80]
    return ("denied" if kind in ("Denied", "Cancelled") else "error"), message


def run(client: Client, out: TextIO = sys.stdout) -> int:
    state = WatchState()
    state.requests.extend(client.watch())
    interactive = sys.stdin.isatty()
    saved = termios.tcgetattr(sys.stdin) if interactive else None
    if interactive:
        tty.setcbreak(sys.stdin.fileno())
    picking: str | None = None
    polling_servers = True
    try:
        while True:
            size = shutil.get_terminal_size((100, 40))
            out.write("\x1b[H\x1b[2J" + "\n".join(state.render(size.columns, size.lines - 1)))
            if picking is not None:
                out.write(f"\ncall ids to approve (comma-separated), Enter: {sanitize_for_terminal(picking)}")
            out.flush()
            message = client.next_event(timeout=0.1)
            while message is not None:
                state.apply(message)
                message = client.next_event(timeout=0)
            if polling_servers and state.ticks % SERVER_CONNECTIONS_EVERY == 0:
                polling_servers = _look_at_server_connections(client, state)
            state.ticks += 1
            key = _key(interactive)
            if key is None:
                continue
            if picking is not None:
                if key in ("\r", "\n"):
                    ids = tuple(c.strip() for c in picking.split(",") if c.strip())
                    _answer(client, state, Decision("approve_selected", approved_call_ids=ids))
                    picking = None
                elif key in ("\x7f", "\b"):
                    picking = picking[:-1]
                elif key == "\x1b":
                    picking = None
                elif key.isprintable():
                    picking += key
                continue
            if key == "q":
                return 0
            if key == "a":
                _answer(client, state, APPROVE_ALL)
            elif key == "d":
                _answer(client, state, Decision("deny_all", reason="denied in toolctl watch"))
            elif key == "p" and state.requests:
                picking = ""
            elif key == "k":
                state.scroll(10)
            elif key == "j":
                state.scroll(-10)
            elif key == "G":
                state.scrolled_back = 0
    finally:
        if saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
        out.write("\n")


def _look_at_server_connections(client: Client, state: WatchState) -> bool:
    """Refresh the servers' connections; False when there is nothing to look at (a daemon
    that keeps no journal, or one too old to list them)."""
    try:
        state.server_connections = client.list_connections(limit=CONNECTIONS_SHOWN)
    except RemoteError:
        return False
    return True


def _answer(client: Client, state: WatchState, decision: Decision) -> None:
    if not state.requests:
        state.status = "nothing to answer"
        return
    request = state.requests.pop(0)
    try:
        client.confirm(request.correlation_id, decision)
        state.status = f"{decision.decision} {request.correlation_id}"
    except Exception as exc:  # an expired or already answered request: say so, keep watching
        state.status = f"could not answer: {exc}"


def _key(interactive: bool) -> str | None:
    if not interactive:
        return None
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    if not ready:
        return None
    data = os.read(sys.stdin.fileno(), 1)
    return data.decode(errors="replace") if data else None
