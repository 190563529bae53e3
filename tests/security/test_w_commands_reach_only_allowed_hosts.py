"""Class W: commands reach only the hosts they are allowed, through the egress proxy.

A command in ``proxy`` mode (the default) sits in a network namespace with loopback only;
``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` point at the proxy, whose rules and whose
person decide each connection. Destinations are real servers on 127.0.0.2 (allowed) and
127.0.0.3 (neither allowed nor denied: asked), exempt from the private-address refusal
by ``allowed_networks``; 127.0.0.4 is denied by name."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from jsonschema import Draft202012Validator

from tests.conftest import DaemonProcess, module_daemon, start_daemon
from tests.webserver import Server, serving
from toold_client import APPROVE_ALL, DENY_ALL, Client, Decision
from toold_daemon.egress.calls import EgressCalls
from toold_daemon.egress.process import EgressAnswer, EgressUsed, from_runner
from toold_daemon.isolation.wire import FrameBuffer, frame
from toold_protocol import ToolResult


@pytest.fixture(scope="module")
def allowed_web() -> Iterator[Server]:
    with serving("127.0.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def unknown_web() -> Iterator[Server]:
    with serving("127.0.0.3") as server:
        yield server


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, allowed_web: Server, unknown_web: Server
) -> Iterator[DaemonProcess]:
    config = f"""
[tools.approval]
allowlist = ["shell", "run_code"]

[tools.network]
allowed_domains = ["127.0.0.2"]
denied_domains = ["127.0.0.4"]
allowed_networks = ["127.0.0.0/8"]
allowed_ports = [80, 443, {allowed_web.port}, {unknown_web.port}]
ask_timeout_seconds = 5
"""
    with module_daemon(tmp_path_factory, "egress", config) as d:
        yield d


def test_an_allowed_host_is_reached_through_the_proxy_and_journaled(daemon: DaemonProcess, allowed_web: Server) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": f"curl -sS {allowed_web.url('/json')}"})
    assert result.ok and '"toold"' in result.content, result.content
    (record,) = result.data["network"]
    assert record["host"] == "127.0.0.2" and record["port"] == allowed_web.port
    assert "allowed_domains" in record["allowed_by"] and record["received"] > 0 and not record["refused"]


def test_a_new_host_is_asked_and_a_no_is_a_clean_403(daemon: DaemonProcess, unknown_web: Server) -> None:
    asked = []

    def answer(request: object) -> Decision:
        asked.append(request)
        return DENY_ALL

    before = len(unknown_web.requests)
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": f"curl -sS -i {unknown_web.url('/json')}"}, on_confirm=answer)
    assert "403" in result.content and len(unknown_web.requests) == before
    assert asked and "127.0.0.3" in asked[0].calls[0].summary  # type: ignore[attr-defined]
    assert result.data["network"][0]["refused"]


def test_a_yes_lets_the_connection_through(daemon: DaemonProcess, unknown_web: Server) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": f"curl -sS {unknown_web.url('/json')}"}, on_confirm=lambda r: APPROVE_ALL)
    assert result.ok and '"toold"' in result.content, result.content
    assert "approved by uid" in result.data["network"][0]["allowed_by"]


def _slow_no(asked: list[object]) -> Callable[[object], Decision]:
    """A person who takes a moment before each no: questions stay open meanwhile."""

    def answer(request: object) -> Decision:
        asked.append(request)
        time.sleep(1.0)  # the connections of a command started at once all want it meanwhile
        return DENY_ALL

    return answer


def test_parallel_connections_to_one_new_host_ask_the_person_once(daemon: DaemonProcess, unknown_web: Server) -> None:
    """Attack: flood the approvers with one question per connection."""
    asked: list[object] = []
    curls = " & ".join([f"curl -sS -o /dev/null {unknown_web.url('/json')}"] * 10)
    with daemon.client(timeout=60) as c:
        result = c.call("shell", {"command": f"{curls}; wait"}, on_confirm=_slow_no(asked))
    assert len(asked) == 1, asked
    network = result.data["network"]
    assert len(network) == 10 and all(record["refused"] for record in network), network


def test_a_command_has_only_a_few_new_hosts_asked_about_at_a_time(daemon: DaemonProcess, unknown_web: Server) -> None:
    """Attack: flood the approvers with a question per host (eight new hosts at once)."""
    asked: list[object] = []
    hosts = [f"127.0.0.{10 + i}" for i in range(8)]
    curls = " & ".join(f"curl -sS -o /dev/null http://{host}:{unknown_web.port}/" for host in hosts)
    with daemon.client(timeout=60) as c:
        result = c.call("shell", {"command": f"{curls}; wait"}, on_confirm=_slow_no(asked))
    network = result.data["network"]
    assert sorted(record["host"] for record in network) == sorted(hosts)
    unasked = [record for record in network if "already waits for answers" in record["refused"]]
    assert len(asked) <= 4 and len(asked) + len(unasked) == 8, (asked, network)


_CONNECTION_LOOP = """
import os, socket
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[1].split(":")
for _ in range({count}):
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"CONNECT 127.0.0.4:{target} HTTP/1.1\\r\\n\\r\\n")
        s.recv(100)
"""


def test_a_command_looping_over_connections_cannot_grow_its_result_without_bound(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """Attack: 520 refused connections in a loop; the result lists 500 and counts the rest."""
    code = _CONNECTION_LOOP.format(count=520, target=allowed_web.port)
    with daemon.client(timeout=120) as c:
        result = c.call("run_code", {"language": "python", "code": code, "network": True, "timeout_ms": 100_000})
    assert result.ok, result.content
    assert len(result.data["network"]) == 500
    assert all(record["refused"] for record in result.data["network"])
    assert result.data["network_omitted"] == {"connections": 20, "refused": 20, "sent": 0, "received": 0}
    with daemon.client() as c:
        schema = {d.name: d for d in c.tools()}["run_code"].data_schema  # type: ignore[union-attr]
    Draft202012Validator(schema).validate(result.data)  # what the tool advertises, MCP clients check


_SEND_AND_VANISH = """
import os, socket
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[1].split(":")
kept = []
for i in range({count}):
    s = socket.create_connection((host, int(port)))
    s.sendall(b"GET http://127.0.0.2:{target}/{mark}-%d HTTP/1.0\\r\\n\\r\\n" % i)
    kept.append(s)
os._exit(0)
"""


@pytest.mark.parametrize("count", [1, 8])
def test_a_request_left_in_the_proxy_as_the_command_ends_is_journaled_or_goes_nowhere(
    daemon: DaemonProcess, allowed_web: Server, count: int
) -> None:
    """Attack: send requests to an allowed host and exit before the proxy has taken them,
    hoping they go out after the call's result (and so outside the journal). Every request
    that reaches the server must be a connection the result records as made."""
    made: dict[str, int] = {}
    with daemon.client(timeout=30) as c:
        for attempt in range(12):
            mark = f"vanish{count}x{attempt}"
            code = _SEND_AND_VANISH.format(count=count, target=allowed_web.port, mark=mark)
            result = c.call("run_code", {"language": "python", "code": code, "network": True})
            assert result.ok, result.content
            made[mark] = len([r for r in (result.data or {}).get("network", []) if not r["refused"]])
    time.sleep(1.5)  # what would go out late has gone out by now
    reached = {mark: len([s for s in allowed_web.requests if s.path.startswith(f"/{mark}-")]) for mark in made}
    assert all(reached[mark] <= made[mark] for mark in made), (reached, made)


def test_a_command_stopped_by_its_timeout_keeps_its_connections_in_the_result(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """Connect, then outlive the call's time limit: the timeout's error result (and so the
    journal) still lists the connection made before it (before, a call that ended without
    an outcome dropped its records)."""
    command = f"curl -sS -o /dev/null {allowed_web.url('/json')}; sleep 30"
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": command, "timeout_ms": 1500})
        stored = c.get_batch(c.list_batches()[0].batch_id).results[0]
    assert not result.ok and result.error is not None and result.error.code == "TIMEOUT", result.content
    (record,) = result.data["network"]
    assert (record["host"], record["port"], record["refused"]) == ("127.0.0.2", allowed_web.port, "")
    assert record["received"] > 0
    assert stored.data == result.data


def test_a_background_commands_connections_are_journaled_with_its_output(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """A background job's connections reach the journal too: ``shell_jobs output`` of the
    ended job lists them (and only then reads ``exited``), as a command's result does."""
    command = (
        f"curl -sS -o /dev/null {allowed_web.url('/json')}; curl -sS -o /dev/null http://127.0.0.4:{allowed_web.port}/"
    )
    with daemon.client(timeout=30) as c:
        started = c.call("shell", {"command": command, "background": True})
        assert started.ok, started.content
        job_id = started.data["job_id"]
        deadline = time.monotonic() + 20
        while (read := c.call("shell_jobs", {"action": "output", "job_id": job_id})).data["state"] == "running":
            assert time.monotonic() < deadline, read.content
            time.sleep(0.05)
        schema = {d.name: d for d in c.tools()}["shell_jobs"].data_schema  # type: ignore[union-attr]
        batch = c.get_batch(c.list_batches()[0].batch_id)
    assert read.data["state"] == "exited", read.content
    allowed, denied = read.data["network"]
    assert (allowed["host"], allowed["port"], allowed["refused"]) == ("127.0.0.2", allowed_web.port, "")
    assert allowed["received"] > 0
    assert denied["host"] == "127.0.0.4" and "denied_domains" in denied["refused"]
    Draft202012Validator(schema).validate(read.data)
    (stored,) = batch.results  # the shell_jobs call that read it, as journaled
    assert stored.data is not None and stored.data["network"] == read.data["network"]


@pytest.mark.parametrize(
    "target",
    ["http://127.0.0.4:{port}/json", "http://169.254.169.254/latest/meta-data/", "http://[::1]:{port}/json",
     "http://0x7f000004:{port}/json", "http://2130706436:{port}/json", "http://127.4:{port}/json"],
)  # fmt: skip
def test_denied_and_internal_destinations_are_refused_unasked(
    daemon: DaemonProcess, allowed_web: Server, target: str
) -> None:
    asked = []
    with daemon.client(timeout=30) as c:
        command = f"curl -sS -i {target.format(port=allowed_web.port)}"
        result = c.call("shell", {"command": command}, on_confirm=lambda r: asked.append(r) or DENY_ALL)
    assert "403" in result.content or not result.ok, result.content
    assert not asked  # numeric spellings are normalised (127.0.0.4, denied by name) before they are judged


@pytest.mark.parametrize(
    "command",
    [
        "python3 -c \"import socket; socket.create_connection(('127.0.0.2', {port}), timeout=3)\"",
        "env -u http_proxy -u HTTP_PROXY -u ALL_PROXY -u all_proxy curl -sS --max-time 3 {url}",
        "curl -sS --noproxy '*' --max-time 3 {url}",
    ],
)
def test_a_program_that_ignores_the_proxy_has_no_network(
    daemon: DaemonProcess, allowed_web: Server, command: str
) -> None:
    before = len(allowed_web.requests)
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": command.format(port=allowed_web.port, url=allowed_web.url("/json"))})
    assert not result.ok, result.content
    assert len(allowed_web.requests) == before


def test_udp_leaves_nothing(daemon: DaemonProcess) -> None:
    """Attack: a datagram (DNS, say) straight to a host address; the proxy carries TCP only."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.2", 0))
    listener.settimeout(1.5)
    port = listener.getsockname()[1]
    send = f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.2', {port}))"
    command = f'python3 -c "{send}"'
    with daemon.client(timeout=30) as c:
        c.call("shell", {"command": command})
    with pytest.raises(TimeoutError):
        listener.recvfrom(10)
    listener.close()


def test_the_proxy_is_reported_as_a_layer(daemon: DaemonProcess, tmp_path: Path) -> None:
    with daemon.client(timeout=30) as c:
        result = c.call("shell", {"command": "env | grep -c -i _proxy="})
    assert result.ok and int(result.content.split()[0]) >= 6


def test_policy_explain_and_doctor_say_how_commands_reach_the_network(daemon: DaemonProcess, tmp_path: Path) -> None:
    import json
    import subprocess

    from tests.conftest import BIN

    with daemon.client(timeout=30) as c:
        explained = c.explain("shell", {"command": "curl https://example.com"})
    assert "network: proxy (allowed domains: 127.0.0.2" in explained.reason, explained.reason
    config = tmp_path / "host.toml"
    config.write_text('[tools.network]\nmode = "proxy"\ntools = { shell = "host" }\n')
    done = subprocess.run(
        [str(BIN / "toold"), "doctor", "--json", "--config", str(config)], capture_output=True, text=True, check=False
    )
    service = json.loads(done.stdout)["service"]
    assert service["network shell"] == {
        "on": False,
        "detail": "host (the host's network, unfiltered)",
        "required": False,
    }
    assert service["network run_code"]["on"] and service["network run_code"]["detail"].startswith("proxy")


def test_an_always_answer_is_kept_for_the_workspace(daemon: DaemonProcess, unknown_web: Server) -> None:
    """Approved "always for this workspace": a later session of the same user is not asked."""
    command = f"curl -sS {unknown_web.url('/json')}?always"
    always = Decision("approve_all", remember_for_workspace=True)
    with daemon.client(timeout=30) as c:
        first = c.call("shell", {"command": command}, on_confirm=lambda r: always)
    asked: list[object] = []
    with daemon.client(timeout=30) as c:
        again = c.call("shell", {"command": command}, on_confirm=lambda r: asked.append(r) or DENY_ALL)
    assert first.ok and again.ok, again.content
    assert not asked and "this workspace" in again.data["network"][0]["allowed_by"]


def test_journal_show_lists_a_calls_connections(daemon: DaemonProcess, allowed_web: Server) -> None:
    import os
    import subprocess

    from tests.conftest import BIN

    with daemon.client(timeout=30) as c:
        assert c.call("shell", {"command": f"curl -sS {allowed_web.url('/json')}"}).ok
        batch_id = c.list_batches()[0].batch_id
    shown = subprocess.run(
        [str(BIN / "toolctl"), "journal", "show", batch_id],
        capture_output=True,
        text=True,
        env={**os.environ, "TOOLD_ENDPOINT": daemon.endpoint},
        check=True,
    ).stdout
    assert f"-> 127.0.0.2:{allowed_web.port} (http) allowed: 127.0.0.2 is in [tools.network] allowed_domains" in shown


def test_commands_started_without_a_zygote_go_through_the_proxy_too(tmp_path: Path, allowed_web: Server) -> None:
    """``zygotes = false``: each command's own child forks the egress process."""
    from tests.conftest import start_daemon as start

    root = tmp_path / "root"
    root.mkdir()
    config = f"""
[tools.approval]
allowlist = ["shell"]
[tools.isolation]
zygotes = false
[tools.network]
allowed_domains = ["127.0.0.2"]
allowed_networks = ["127.0.0.0/8"]
allowed_ports = [{allowed_web.port}]
"""
    d = start(tmp_path, root, config=config)
    try:
        with d.client(timeout=30) as c:
            fetched = c.call("shell", {"command": f"curl -sS {allowed_web.url('/json')}"})
            refused = c.call("shell", {"command": "curl -sS -i http://127.0.0.3/"})
    finally:
        d.stop()
    assert fetched.ok and '"toold"' in fetched.content and fetched.data["network"][0]["received"] > 0
    assert "403" in refused.content and refused.data["network"][0]["refused"]


async def test_questions_about_made_up_calls_cannot_pile_up_in_the_daemon() -> None:
    """Attack from the egress process (it runs as the client, and parses what commands
    send it): questions about thousands of made-up calls. A question about a call not yet
    registered waits a moment for it, but only a few at a time per link; the rest are
    refused at once, so the daemon holds no task per made-up token."""

    async def never(call: object, host: str, port: int) -> tuple[bool, str]:
        raise AssertionError("nothing is decided for a call that does not exist")

    ours, theirs = socket.socketpair()
    link, egress = trio.socket.from_stdlib_socket(ours), trio.socket.from_stdlib_socket(theirs)
    calls = EgressCalls(never)
    flood = 2_000  # refused in about 0.3 s here (5,000: 0.7 s, past 1.5 s once under load)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(calls.serve, link)
        payload = b"".join(frame(EgressUsed(id=i, token=f"made-up-{i}")) for i in range(flood))

        async def send_all() -> None:
            view = memoryview(payload)
            while view:
                view = view[await egress.send(view) :]

        nursery.start_soon(send_all)
        refused, buffer = 0, FrameBuffer()
        with trio.move_on_after(1.5):  # well before a waiting question gives up (2 s)
            while refused < flood:
                for body in buffer.feed(await egress.recv(65536)):
                    answer = from_runner.decode(body)
                    assert isinstance(answer, EgressAnswer) and not answer.allowed
                    refused += 1
        assert refused >= flood - 64, f"only {refused} of {flood} answered at once: the rest each hold a task"
        nursery.cancel_scope.cancel()


@contextmanager
def hostile_server_ran(
    tmp_path: Path, name: str, source: str, config: str = ""
) -> Iterator[tuple[DaemonProcess, Client]]:
    """A daemon whose MCP server ``name`` (network on, through the proxy) has run
    ``source`` with the server's own Python: (the daemon, a client of it)."""
    from tests.e2e.test_mcp_gateway import PYTHON, hostile_entry

    root = tmp_path / "root"
    root.mkdir()
    d = start_daemon(
        tmp_path, root, config=f'[tools.approval]\nmode = "auto"\n{config}\n{hostile_entry(name)}network = true\n'
    )
    try:
        with d.client(timeout=60) as client:
            ran = client.call(f"mcp__{name}__run", {"argv": [PYTHON, "-c", source]})
            assert ran.ok and "done" in ran.content, ran.content
            yield d, client
    finally:
        d.stop()


LOOPING_CLIENT = """
import os, socket
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rsplit(":", 1)
for i in range(150):
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"GET http://10.255.255.1:{1000 + i}/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
        s.recv(4096)
print("done")
"""


def test_an_mcp_server_connecting_in_a_loop_keeps_only_its_share_of_the_journal(tmp_path: Path) -> None:
    """Attack: an MCP server (untrusted code, long-lived) opens connection after
    connection through the proxy to grow the daemon's journal without bound. Each is
    refused and recorded, but only the newest ``server_connections_kept`` stay."""
    with hostile_server_ran(tmp_path, "loop", LOOPING_CLIENT, "[journal]\nserver_connections_kept = 20") as (d, client):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and d.log.read_text().count("audit=connection") < 150:
            time.sleep(0.05)
        kept = client.list_connections("mcp:loop", limit=10_000)
    assert d.log.read_text().count("audit=connection") == 150  # every one was judged and recorded
    assert 20 <= len(kept) <= 40, len(kept)
    ports = [c.port for c in kept]
    assert ports == list(range(1149, 1149 - len(kept), -1)), ports  # the newest, newest first
    assert all(c.refused and c.host == "10.255.255.1" for c in kept)


ESCAPING_CLIENT = """
import os, socket
host, port = os.environ["HTTP_PROXY"].removeprefix("http://").rsplit(":", 1)
with socket.create_connection((host, int(port))) as s:
    s.sendall(b"CONNECT \\x1b[2J\\x1b]0;pwned\\x07evil.invalid:443 HTTP/1.1\\r\\n\\r\\n")
    s.recv(4096)
print("done")
"""


def test_a_servers_connection_cannot_put_terminal_escapes_in_front_of_the_person(tmp_path: Path) -> None:
    """Attack: an MCP server names a host made of terminal escape sequences (clear the
    screen, retitle the window), hoping the person listing the journal's connections
    gets them raw. The connection is refused, kept, and listed neutralised."""
    from tests.conftest import BIN

    with hostile_server_ran(tmp_path, "esc", ESCAPING_CLIENT) as (d, client):
        deadline = time.monotonic() + 10
        while not (kept := client.list_connections("mcp:esc")) and time.monotonic() < deadline:
            time.sleep(0.05)
        shown = subprocess.run(
            [str(BIN / "toolctl"), "--endpoint", d.endpoint, "journal", "connections"],
            capture_output=True,
            timeout=60,
        )
    assert len(kept) == 1 and kept[0].refused and "\x1b" in kept[0].host  # kept as it came
    assert shown.returncode == 0 and b"evil.invalid:443" in shown.stdout, shown
    assert b"\x1b" not in shown.stdout and b"\x07" not in shown.stdout, shown.stdout


#: The ports listening on the loopback of a command's network namespace, but its own
#: proxy's: as the kernel lists them (a scan of every port by connecting took long enough
#: under load to miss a command that lives a second), by the scan where /proc/net/tcp
#: cannot be read. (A template for ``str.format``: its braces are doubled.)
_LISTENERS = """
import os, socket, time
own = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])

def listening():
    try:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        found = set()
        for row in rows:
            address, state = row[1], row[3]
            if state == "0A" and address.startswith("0100007F:"):
                found.add(int(address.split(":")[1], 16))
        return sorted(found - {{own}})
    except OSError:
        ports = []
        for port in range(32768, 61000):
            if port == own:
                continue
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                ports.append(port)
            except OSError:
                pass
        return ports

def listening_soon():
    # what listens, looked for again for up to a second (a command may start late under load)
    looking = time.monotonic() + 1.0
    while not (ports := listening()) and time.monotonic() < looking:
        time.sleep(0.01)
    return ports
"""

#: Connects to every listener on loopback but its own proxy's (as soon as there is one,
#: for up to a second) and leaves a request for the allowed server in each; says how
#: many took one.
_PLANT = (
    _LISTENERS
    + """
planted = 0
for port in listening_soon():
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        s.sendall(b"GET http://127.0.0.2:{target}/{mark} HTTP/1.1\\r\\nHost: 127.0.0.2\\r\\n\\r\\n")
        planted += 1
    except OSError:
        continue
print("planted", planted)
"""
)


def test_a_command_cannot_leave_a_request_for_the_next_command_of_its_zygote(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """Attack: a zygote makes the next command's proxy listener while it waits for that
    command, and all its commands share one loopback. A command scans loopback for any
    listener but its own and leaves a request in it, to be handed over as the next
    command's connection: under that call's rules and a person's answers for it, and in
    its records. The listener made ahead is bound but listens only once its command
    starts, so the request goes nowhere and the next command's result records nothing.
    (A listener of a call that has just ended may still answer a moment; the egress
    process serves nothing for an ended call.)"""
    mark = f"planted-{time.monotonic_ns()}"
    with daemon.client(timeout=60) as c:
        c.call("shell", {"command": "true"})  # the zygote is up, its next listener made
        scan = c.call("shell", {"command": f"python3 -c '{_PLANT.format(target=allowed_web.port, mark=mark)}'"})
        assert scan.ok, scan.content
        victim = c.call("shell", {"command": "sleep 0.5"})  # time for a planted request to go out
    assert victim.ok
    assert not (victim.data or {}).get("network"), victim.data
    time.sleep(0.5)
    assert not [r for r in allowed_web.requests if r.path.startswith(f"/{mark}")]


def test_a_command_cannot_leave_a_request_in_a_running_commands_listener(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """Attack: while another call's command runs (a person may have answered yes to a host
    for that call), a command of the same zygote finds that command's proxy listener on
    the shared loopback and leaves a request there, to be served as the other call's
    connection, under its rules and answers, and recorded in its result. The egress
    process serves only connections made in the call's own cgroup: the request goes
    nowhere and the running call records nothing."""
    mark = f"borrowed-{time.monotonic_ns()}"
    victim: list[ToolResult] = []
    with daemon.client(timeout=60) as c, daemon.client(timeout=60) as other:
        c.call("shell", {"command": "true"})
        running = threading.Thread(target=lambda: victim.append(other.call("shell", {"command": "sleep 2"})))
        running.start()
        time.sleep(0.5)  # the victim runs, its listener listening
        plant = c.call("shell", {"command": f"python3 -c '{_PLANT.format(target=allowed_web.port, mark=mark)}'"})
        running.join()
    planted = re.search(r"planted (\d+)", plant.content)
    assert plant.ok and planted and int(planted.group(1)) >= 1, plant.content  # it reached the victim's listener
    (result,) = victim
    assert not (result.data or {}).get("network"), result.data
    assert not [r for r in allowed_web.requests if r.path.startswith(f"/{mark}")]


#: Connects again and again to every listener on loopback but its own, for a while,
#: leaving a request in each: a flood meant to jam another command's proxy or slip a
#: request in among its own.
_FLOOD = (
    _LISTENERS
    + """
ports = listening_soon()
sent, deadline = 0, time.monotonic() + 1.5
while time.monotonic() < deadline:
    for port in ports:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
            s.sendall(b"GET http://127.0.0.2:{target}/{mark} HTTP/1.1\\r\\nHost: 127.0.0.2\\r\\n\\r\\n")
            s.close()
            sent += 1
        except OSError:
            pass
print("sent", sent, "to", len(ports))
"""
)


def test_a_flood_into_another_commands_listener_neither_jams_it_nor_gets_through(
    daemon: DaemonProcess, allowed_web: Server
) -> None:
    """Attack: while a command waits to make its own request, another command of the
    zygote floods that command's proxy listener with requests of its own. None is
    served; the victim's own request is, and its result records that one alone."""
    mark = f"flood-{time.monotonic_ns()}"
    victim: list[ToolResult] = []
    command = f"sleep 1.2; curl -sS {allowed_web.url('/json')}"
    with daemon.client(timeout=60) as c, daemon.client(timeout=60) as other:
        c.call("shell", {"command": "true"})
        running = threading.Thread(target=lambda: victim.append(other.call("shell", {"command": command})))
        running.start()
        time.sleep(0.3)  # the victim runs, its listener listening
        flood = c.call("shell", {"command": f"python3 -c '{_FLOOD.format(target=allowed_web.port, mark=mark)}'"})
        running.join()
    sent = re.search(r"sent (\d+)", flood.content)
    assert flood.ok and sent and int(sent.group(1)) > 10, flood.content  # it did flood
    (result,) = victim
    assert result.ok and '"toold"' in result.content, result.content
    (record,) = result.data["network"]
    assert record["port"] == allowed_web.port and not record["refused"]
    assert not [r for r in allowed_web.requests if r.path.startswith(f"/{mark}")]
