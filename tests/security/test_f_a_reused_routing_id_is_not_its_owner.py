"""Class F, identities: a client chooses its own ZeroMQ routing id. The daemon knew a
peer by that id and the credentials its first frame came with; once a client's
connection closed, another user's connection under the same id was taken for it until
the daemon noticed the close (up to 0.2 s), and its requests ran as the first client.
Every frame's credentials (the ZAP user id libzmq attaches) are now checked against
those the id was first seen with: a new owner is a new peer; and a gone client's
batches no longer send to its id."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import zmq

import toold_protocol as p
from tests.conftest import reachable_daemon
from tests.security.test_q_one_user_cannot_take_the_daemon_down import OtherUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")

SHARED_ID = b"\x01chosen-id"


def test_another_users_connection_under_a_closed_clients_routing_id_is_not_that_client(tmp_path: Path) -> None:
    """Root's client asks for stats under a chosen routing id and closes; another uid then
    connects under the same id and asks for stats, many times over. Each answer must be
    the other uid's own view, never root's."""
    with reachable_daemon(tmp_path) as daemon:
        scopes = []
        for _ in range(5):
            assert _as_the_same_id(daemon.endpoint) == "all"  # root's own client, then closed
            attacker = OtherUser(lambda: print(_as_the_same_id(daemon.endpoint)))
            try:
                scopes.append(attacker.line().strip())
            finally:
                attacker.kill()
        assert scopes and all(scope == "own" for scope in scopes), scopes


def _client(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    client.setsockopt(zmq.ROUTING_ID, SHARED_ID)
    client.connect(endpoint)
    return client


def _stats_scope(client: zmq.Socket[bytes]) -> str:
    client.send(p.encode(p.GetStats(id=1)))
    if not client.poll(1000):
        return "no answer"
    reply = p.decode_daemon_message(client.recv())
    return reply.scope if isinstance(reply, p.Stats) else type(reply).__name__


def _as_the_same_id(endpoint: str) -> str:
    """Connect under the shared id at once (retrying while libzmq still holds the last
    connection's id), ask, close; the answer's scope."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            client = _client(ctx, endpoint)
            scope = _stats_scope(client)
            client.close()
            if scope != "no answer":
                return scope
        return "no answer"
    finally:
        ctx.destroy(linger=0)


def test_a_closed_clients_batch_does_not_answer_whoever_takes_its_routing_id_next(tmp_path: Path) -> None:
    """Root submits a command under a chosen routing id and closes at once; the batch runs
    on (``on_client_disconnect = "finish"``). Another uid connecting under that id must
    not receive the batch's events or its outcome."""
    config = '[daemon]\non_client_disconnect = "finish"\n[tools.approval]\nallowlist = ["shell"]\n'
    with reachable_daemon(tmp_path, config=config) as daemon:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            root_client = _client(ctx, daemon.endpoint)
            call = p.ToolCall(call_id="c", name="shell", arguments={"command": "sleep 0.6; echo secret-of-root"})
            root_client.send(p.encode(p.SubmitBatch(id=1, calls=[call], events="all")))
            assert root_client.poll(5000)
            assert isinstance(p.decode_daemon_message(root_client.recv()), p.BatchAccepted)
            root_client.close()
        finally:
            ctx.destroy(linger=0)
        attacker = OtherUser(lambda: print(_listen_as_the_same_id(daemon.endpoint)))
        try:
            heard = attacker.line().strip()
        finally:
            attacker.kill()
        assert heard == "nothing of root's", heard


def _listen_as_the_same_id(endpoint: str) -> str:
    """In the other uid's process: take the id (ping until answered), then read for 2 s."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            client = _client(ctx, endpoint)
            client.send(p.encode(p.Ping(id=7)))
            if client.poll(300):
                break
            client.close()
        else:
            return "never answered"
        frames = []
        while client.poll(2000):
            frames.append(client.recv())
        leaked = [f for f in frames if b"secret-of-root" in f]
        return "nothing of root's" if not leaked else f"{len(leaked)} of root's frames"
    finally:
        ctx.destroy(linger=0)
