"""The packaged configuration (``/etc/toold/config.toml``) is valid as shipped, and so is
each commented example in it once uncommented alone (with its commented section header):
an administrator who follows one must get a daemon that starts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN

PACKAGED = Path(__file__).resolve().parents[2] / "packaging" / "config.toml"
SETTING = re.compile(r"^#\s*([a-z_]+)\s*=")
HEADER = re.compile(r"^#?\s*\[[a-z_.]+\]\s*$")


def examples() -> list[int]:
    return [i for i, line in enumerate(PACKAGED.read_text().splitlines()) if SETTING.match(line)]


def uncommented(number: int) -> str:
    """The file with line ``number`` uncommented, and its section header if that is commented."""
    lines = PACKAGED.read_text().splitlines()
    lines[number] = lines[number].lstrip("#").lstrip()
    header = next((i for i in range(number, -1, -1) if HEADER.match(lines[i])), None)
    if header is not None and lines[header].startswith("#"):
        lines[header] = lines[header].lstrip("#").lstrip()
    return "\n".join(lines) + "\n"


def check(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.toml"
    config.write_text(text)
    return subprocess.run([str(BIN / "toold"), "check-config", str(config)], capture_output=True, text=True)


def test_the_packaged_configuration_is_valid(tmp_path: Path) -> None:
    done = check(PACKAGED.read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("number", examples())
def test_each_commented_example_is_valid_alone(tmp_path: Path, number: int) -> None:
    assert examples(), "the packaged configuration has commented examples"
    done = check(uncommented(number), tmp_path)
    assert done.returncode == 0, (PACKAGED.read_text().splitlines()[number], done.stdout + done.stderr)
