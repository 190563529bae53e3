"""The units in systemd/: systemd-analyze verify passes on each, and the system service's
exposure score stays within what we claim."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def installed_copy(source: Path, target: Path) -> Path:
    """The unit as installed, with /usr/bin/toold pointing at this checkout's toold
    (verify insists that ExecStart's program exists)."""
    target.mkdir(parents=True, exist_ok=True)
    for unit in source.glob("toold.*"):
        (target / unit.name).write_text(unit.read_text().replace("/usr/bin/toold", str(BIN / "toold")))
    return target


def analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def test_system_units_verify(tmp_path: Path) -> None:
    units = installed_copy(UNITS, tmp_path / "system")
    done = analyze("verify", str(units / "toold.socket"), str(units / "toold.service"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_user_units_verify(tmp_path: Path) -> None:
    units = installed_copy(UNITS / "user", tmp_path / "user")
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = analyze("verify", "--user", str(units / "toold.socket"), str(units / "toold.service"), env=env)
    assert done.returncode == 0, done.stderr


def test_system_service_exposure_is_at_most_5(tmp_path: Path) -> None:
    units = installed_copy(UNITS, tmp_path / "system")
    done = analyze("security", "--offline=true", str(units / "toold.service"))
    found = re.search(r"Overall exposure level for toold.service: ([0-9.]+)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    assert float(found.group(1)) <= 5.0


def test_the_socket_lets_only_group_toold_in() -> None:
    socket_unit = (UNITS / "toold.socket").read_text()
    assert "ListenStream=/run/toold/toold.sock" in socket_unit
    assert "SocketGroup=toold" in socket_unit and "SocketMode=0660" in socket_unit
    service = (UNITS / "toold.service").read_text()
    for setting in ("Type=notify", "WatchdogSec=", "Delegate=yes", "StateDirectory=toold", "ExecReload="):
        assert setting in service


def test_every_relaxed_setting_says_why() -> None:
    """A setting left open carries a comment (on the lines just above) saying what needs it."""
    lines = (UNITS / "toold.service").read_text().splitlines()
    relaxed = re.compile(r"^(\w+)=(no|$)|^(User=root|CapabilityBoundingSet=|Delegate=yes|ReadWritePaths=)")
    for index, line in enumerate(lines):
        if relaxed.match(line) and not line.startswith("AmbientCapabilities"):
            above = lines[max(0, index - 8) : index]
            assert any(a.startswith("#") for a in above), f"no reason given for {line}"
