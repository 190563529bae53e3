"""When the spawner warms the tools: after a quiet quarter second, or at the latest a few
seconds after its first request however busy it is (a client asking without pause must
not keep everyone's web_fetch from the warmed stack). On a real socket pair."""

from __future__ import annotations

import socket
import time

from toold_daemon.isolation import spawner
from toold_daemon.isolation.spawner import warming_due


def test_quiet_warms_a_waiting_request_does_not_and_a_busy_spawner_warms_in_the_end() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        now = time.monotonic()
        assert warming_due(False, now, ours)  # nothing came within the quiet time
        assert not warming_due(True, now, ours)  # warmed already
        theirs.sendall(b"x")  # a request is waiting
        assert not warming_due(False, now, ours)
        assert warming_due(False, now - spawner.WARM_AT_LATEST_S, ours)  # busy, but it is time
