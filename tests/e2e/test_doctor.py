"""`toold doctor --json`: the isolation layers and how the daemon runs as a service."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, DaemonProcess
from toold_daemon.config import SYSTEM_CONFIG


def doctor(*args: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run([str(BIN / "toold"), "doctor", "--json", *args], capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


def test_reports_the_running_daemons_socket_and_journal(daemon: DaemonProcess, tmp_path: Path) -> None:
    code, report = doctor("--endpoint", daemon.endpoint, "--state-dir", str(tmp_path / "state"))
    service = report["service"]
    assert isinstance(service, dict)
    mode = oct(os.stat(daemon.socket).st_mode & 0o777)[2:]
    assert service["socket"]["on"] and str(daemon.socket) in service["socket"]["detail"]
    assert service["socket"]["detail"].endswith(mode.zfill(4))
    assert service["journal"]["on"] and "journal.sqlite3" in service["journal"]["detail"]
    assert "0 call(s) marked interrupted, 0 batch(es) waiting" in service["journal"]["detail"]
    assert not service["socket activation"]["on"] and not service["notify"]["on"]
    assert "cgroup" in service["cgroup moves"]["detail"]  # not required: says how, either way
    assert code == 0 and report["ok"] is True
    assert isinstance(report["layers"], dict) and "landlock" in report["layers"]


def test_a_missing_service_user_is_required_and_fails(tmp_path: Path) -> None:
    config = tmp_path / "toold.toml"
    config.write_text('[daemon]\nuser = "no-such-user-toold"\n')
    code, report = doctor("--config", str(config), "--state-dir", str(tmp_path / "state"))
    assert code == 1 and report["ok"] is False
    assert report["required_off"] == ["service user"]


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_CONFIG.exists(), reason="needs root and no installed config")
def test_doctor_reads_the_system_config_when_none_is_named(tmp_path: Path) -> None:
    created = not SYSTEM_CONFIG.parent.exists()
    SYSTEM_CONFIG.parent.mkdir(exist_ok=True)
    try:
        SYSTEM_CONFIG.write_text('[daemon]\nuser = "no-such-user-toold"\n')
        code, report = doctor("--state-dir", str(tmp_path / "state"))
        assert code == 1 and report["required_off"] == ["service user"]
    finally:
        SYSTEM_CONFIG.unlink(missing_ok=True)
        if created:
            SYSTEM_CONFIG.parent.rmdir()


def test_notify_and_watchdog_are_reported_from_the_environment(tmp_path: Path) -> None:
    env = os.environ | {"NOTIFY_SOCKET": "@toold-test", "WATCHDOG_USEC": "30000000"}
    done = subprocess.run(
        [str(BIN / "toold"), "doctor", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("notify"))
    assert "on" in line and "@toold-test" in line and "watchdog every 15s" in line


def test_with_the_packaged_config_doctor_looks_where_the_units_put_things() -> None:
    """The system service's socket is toold.socket's and its journal is in StateDirectory:
    doctor reading the packaged configuration reports on those, not on a per-user path."""
    packaged = Path(__file__).resolve().parents[2] / "packaging" / "config.toml"
    _code, report = doctor("--config", str(packaged))
    service = report["service"]
    assert isinstance(service, dict)
    assert "/run/toold/toold.sock" in service["socket"]["detail"]
    assert "/var/lib/toold/journal.sqlite3" in service["journal"]["detail"]
    units = Path(__file__).resolve().parents[2] / "systemd"
    assert "ListenStream=/run/toold/toold.sock" in (units / "toold.socket").read_text()
    assert "StateDirectory=toold" in (units / "toold.service").read_text()


def test_bytecode_is_reported_off_when_the_daemon_would_compile_itself(tmp_path: Path) -> None:
    """A copy of the daemon's sources without their bytecode, where Python may not write
    it (as under the service's ProtectSystem=strict): every start would compile it again,
    and the doctor says so; the bootstrapped tree (compiled) is on."""
    daemon_src = Path(__file__).resolve().parents[2] / "daemon/src"
    sources_only = shutil.ignore_patterns("__pycache__")
    shutil.copytree(daemon_src / "toold_daemon", tmp_path / "toold_daemon", ignore=sources_only)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(tmp_path))
    command = [str(BIN / "python"), "-m", "toold_daemon", "doctor", "--json", "--state-dir", str(tmp_path / "state")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    copied = json.loads(done.stdout)["service"]["bytecode"]
    assert not copied["on"] and str(tmp_path / "toold_daemon") in copied["detail"], copied
    _, report = doctor("--state-dir", str(tmp_path / "state"))
    compiled = report["service"]["bytecode"]  # type: ignore[index]
    assert compiled["on"] and "modules loaded have current bytecode" in compiled["detail"], compiled
