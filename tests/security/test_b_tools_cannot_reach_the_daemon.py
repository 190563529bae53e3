"""Class B: a tool can never reach the daemon: not its socket, not its /proc entries,
not its signals. Every test runs real commands in a real daemon and attacks it."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import DaemonProcess, module_daemon

CONFIG = """
[tools.approval]
allowlist = ["shell", "run_code"]
"""
SECRET = "sk-this-must-not-leak-42"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with module_daemon(tmp_path_factory, "reach", CONFIG, env={"DEPLOY_API_TOKEN": SECRET}) as d:
        yield d


def shell(daemon: DaemonProcess, command: str, timeout: float = 60) -> str:
    with daemon.client(timeout=timeout) as c:
        result = c.call("shell", {"command": command, "timeout_ms": int(timeout * 1000)})
    return result.content


def spawner_pid(daemon: DaemonProcess) -> int:
    children = psutil.Process(daemon.proc.pid).children()
    assert children, "the daemon has no spawner"
    return children[0].pid


REPO = Path(__file__).resolve().parents[2]


def plant_client(root: Path) -> str:
    """What an attacker would do: copy a client into the workspace (the sandbox cannot
    read the repository) and return the command that runs toolctl from there."""
    lib = root / "lib"
    if not lib.exists():
        shutil.copytree(REPO / "client/src/toold_client", lib / "toold_client")
        shutil.copytree(REPO / "protocol/src/toold_protocol", lib / "toold_protocol")
        (lib / "toolctl.py").write_text("import sys\nfrom toold_client.cli import main\nsys.exit(main())\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(lib / 'toolctl.py'))}"


def test_a_command_cannot_talk_to_the_daemon_socket(daemon: DaemonProcess) -> None:
    """Attack: a command connects to the daemon's socket to submit (and approve) a call of
    its own. The daemon sees a process below its spawner and refuses it at the door."""
    toolctl = plant_client(daemon.root)
    # Bounded: once (in one of many CI runs, never reproduced) the planted client, turned
    # away over and over, did not exit and the call timed out. Refused it was, all the same:
    # what is checked is that it got no answer (not 0) and that the daemon refused it.
    out = shell(daemon, f"timeout 20 {toolctl} --endpoint {daemon.endpoint} ping --wait 2; echo rc=$?")
    assert "rc=0" not in out and ("rc=2" in out or "rc=124" in out), out
    assert "refused a connection" in daemon.log.read_text()
    with daemon.client(timeout=10) as c:  # the daemon serves everyone else
        c.ping()


def test_a_daemonised_grandchild_is_refused_too(daemon: DaemonProcess) -> None:
    """Attack: double-fork and setsid so the connecting process is no longer the command's
    child; the spawner is a subreaper, so it is still below it."""
    toolctl = plant_client(daemon.root)
    script = (
        "import os, subprocess, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(0.3)\n"
        f"        r = subprocess.run({toolctl!r} + ' --endpoint {daemon.endpoint} ping --wait 2', shell=True)\n"
        "        open('grandchild.txt', 'w').write(str(r.returncode))\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    (daemon.root / "escape.py").write_text(script)
    shell(daemon, f"{shlex.quote(sys.executable)} escape.py; sleep 4; cat grandchild.txt")
    marker = daemon.root / "grandchild.txt"
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == "2"


def test_without_network_no_socket_at_all(daemon: DaemonProcess) -> None:
    """Attack: run_code (network off) opens an AF_UNIX socket to the daemon directly."""
    path = daemon.endpoint.removeprefix("ipc://")
    code = (
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        f"    s.connect({path!r})\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    with daemon.client(timeout=60) as c:
        result = c.call("run_code", {"language": "python", "code": code})
    assert "refused 1" in result.content and "connected" not in result.content


def test_proc_entries_of_the_daemon_spawner_and_zygote_are_closed(daemon: DaemonProcess) -> None:
    """Attack: read the environment, fds and memory of the daemon, the spawner and the
    zygote (the command's parent) through /proc, and borrow an fd through /proc/PID/fd.
    (A root client may still list the fd numbers of a root daemon: the directory is
    root's; what the fds are, and opening them, needs ptrace access, which is refused.)"""
    targets = [daemon.proc.pid, spawner_pid(daemon)]
    probes = []
    for pid in [*targets, "$PPID"]:
        probes += [
            f"cat /proc/{pid}/environ >/dev/null 2>&1 && echo LEAK-environ-{pid}",
            f"readlink /proc/{pid}/fd/0 >/dev/null 2>&1 && echo LEAK-fd-{pid}",
            f"readlink /proc/{pid}/cwd >/dev/null 2>&1 && echo LEAK-cwd-{pid}",
            f"head -c1 /proc/{pid}/mem >/dev/null 2>&1 && echo LEAK-mem-{pid}",
            f"echo forged > /proc/{pid}/fd/3 2>/dev/null && echo LEAK-write-{pid}",
        ]
    out = shell(daemon, "; ".join(probes) + "; echo done")
    assert "done" in out and "LEAK" not in out, out


def test_secrets_are_scrubbed_from_the_environment_block(daemon: DaemonProcess) -> None:
    """Attack (as root, who may read any /proc): the daemon's original environment block
    still holds what it was started with unless it overwrote it."""
    for pid in (daemon.proc.pid, spawner_pid(daemon)):
        block = Path(f"/proc/{pid}/environ").read_bytes()
        assert SECRET.encode() not in block
        assert b"DEPLOY_API_TOKEN=" in block  # the name stays, its value is gone


@pytest.mark.parametrize("target", ["daemon", "spawner", "zygote", "everyone"])
def test_a_command_cannot_signal_the_daemon_its_spawner_or_its_zygote(daemon: DaemonProcess, target: str) -> None:
    """Attack: kill the daemon (or the spawner, or the zygote that started the command,
    or every process of the uid with kill -1)."""
    pid = {
        "daemon": str(daemon.proc.pid),
        "spawner": str(spawner_pid(daemon)),
        "zygote": "$PPID",
        "everyone": "-1",
    }[target]
    out = shell(daemon, f"kill -9 -- {pid} 2>&1; echo rc=$?; kill -STOP -- {pid} 2>&1; echo rc=$?")
    assert out.count("rc=0") == 0, out
    assert daemon.proc.poll() is None
    with daemon.client(timeout=10) as c:
        assert "alive" in c.call("shell", {"command": "echo alive"}).content


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root daemon serving a root client")
def test_a_root_clients_commands_hold_no_capability(daemon: DaemonProcess) -> None:
    """Attack: a root client's command uses root's capabilities (read a non-dumpable
    process, load a module, change file owners)."""
    out = shell(daemon, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; id -u")
    caps = dict(line.split(":\t") for line in out.splitlines() if line.startswith("Cap"))
    assert caps, out
    assert all(int(value, 16) == 0 for value in caps.values()), caps
    assert "\n0\n" in out  # still uid 0: only the capabilities are gone


def test_the_daemon_and_spawner_are_not_dumpable(daemon: DaemonProcess) -> None:
    """A process that is not dumpable has its /proc files owned by root whatever its uid,
    and ptrace-like access needs CAP_SYS_PTRACE; the kernel says so in /proc/PID/status
    only indirectly, so ask prctl through a fresh Python in the same state: here we read
    the owner of a process we know runs as the test's uid."""
    for pid in (daemon.proc.pid, spawner_pid(daemon)):
        assert os.stat(f"/proc/{pid}/environ").st_uid == 0
