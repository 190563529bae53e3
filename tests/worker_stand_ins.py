"""Tool workers played by a test: the pool (``Workers``) starts each through ``start``,
which hands it the worker's end of the real socket pair; the test then reads the real
request frames and writes the worker's real answers. Each worker's pid is a real
process, which the pool kills when it ends that worker."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import msgspec
import trio

from toold_daemon.isolation.wire import Chunk, Outcome, SpawnRequest, frame, read_frame


class StandIn:
    """One worker's side: its socket end and a process for its pid."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.process = subprocess.Popen(["sleep", "60"])
        self.say(Outcome(ok=True, data={"roots": ["/"]}))  # ready

    def request(self) -> SpawnRequest:
        body = read_frame(self.sock.fileno())
        assert body is not None
        return msgspec.msgpack.decode(body, type=SpawnRequest)

    def say(self, *messages: Chunk | Outcome) -> None:
        for message in messages:
            self.sock.sendall(frame(message))

    def say_later(self, *messages: Chunk | Outcome) -> None:
        """In 0.1 s, from a thread (the test's loop thread is asleep in a wait by then)."""

        def later() -> None:
            time.sleep(0.1)
            self.say(*messages)

        threading.Thread(target=later, daemon=True).start()

    def ended(self) -> bool:
        """Whether its process was killed (waits up to 2 s for it)."""
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return False
        return True


class StandIns:
    """Every worker a pool starts, in order (``start`` is the pool's ``start_child``)."""

    def __init__(self) -> None:
        self.started: list[StandIn] = []

    async def start(self, request: SpawnRequest, fd: int) -> int:
        stand_in = StandIn(socket.socket(fileno=os.dup(fd)))
        self.started.append(stand_in)
        return stand_in.process.pid

    def close(self) -> None:
        for stand_in in self.started:
            stand_in.process.kill()
            stand_in.process.wait()
            stand_in.sock.close()


class Bystander:
    """Another task on the loop (another user's work), counting the turns it gets.
    ``pause``: how long it sleeps between turns; 0 takes every turn the loop gives."""

    def __init__(self, pause: float = 0.0) -> None:
        self.turns = 0
        self.pause = pause

    async def run(self) -> None:
        while True:
            self.turns += 1
            if self.pause:
                await trio.sleep(self.pause)
            else:
                await trio.lowlevel.checkpoint()
