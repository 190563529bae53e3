"""Whether any plugin may be installed is decided without importing importlib.metadata,
and never says no where importlib.metadata would find one."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import distributions
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toold_daemon.tools.plugin_loader import GROUP, _group_declared


def _distribution(where: Path, name: str, entry_points: str | None, suffix: str = ".dist-info") -> None:
    info = where / f"{name}-1.0{suffix}"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)


def _found_by_importlib(path: list[str]) -> bool:
    return any(point.group == GROUP for dist in distributions(path=path) for point in dist.entry_points)


_SECTIONS = st.sampled_from(
    [
        f"[{GROUP}]\nmine = pkg.tool:Mine\n",
        f"  [{GROUP}]  \nmine = pkg.tool:Mine\n",
        "[console_scripts]\nmine = pkg.cli:main\n",
        "[toold.tool]\nnear = pkg:Near\n",
        f"[{GROUP}]\n",  # the group with nothing in it
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    dists=st.lists(
        st.tuples(st.one_of(st.none(), st.lists(_SECTIONS, max_size=2)), st.sampled_from([".dist-info", ".DIST-INFO"])),
        max_size=4,
    )
)
def test_the_check_says_yes_wherever_importlib_metadata_finds_an_entry_point(
    tmp_path_factory: pytest.TempPathFactory, dists: list[tuple[list[str] | None, str]]
) -> None:
    where = tmp_path_factory.mktemp("site")
    for number, (sections, suffix) in enumerate(dists):
        _distribution(where, f"d{number}", None if sections is None else "".join(sections), suffix)
    if _found_by_importlib([str(where)]):
        assert _group_declared(GROUP, [str(where)])


def test_no_distribution_naming_the_group_is_a_no(tmp_path: Path) -> None:
    _distribution(tmp_path, "scripts", "[console_scripts]\nx = y:z\n")
    _distribution(tmp_path, "plain", None)
    (tmp_path / "loose-1.0.egg-info").write_text("Metadata-Version: 1.0\n")  # an .egg-info file, not a directory
    assert not _group_declared(GROUP, [str(tmp_path), str(tmp_path / "missing")])


def test_egg_info_directories_and_the_current_directory_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _distribution(tmp_path, "develop", f"[{GROUP}]\nd = pkg:D\n", suffix=".egg-info")
    assert _group_declared(GROUP, [str(tmp_path)])
    monkeypatch.chdir(tmp_path)
    assert _group_declared(GROUP, [""])  # "" on sys.path is the current directory


def test_a_zip_on_the_path_is_left_to_importlib_metadata(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("bundle-1.0.dist-info/entry_points.txt", f"[{GROUP}]\nz = pkg:Z\n")
    assert _group_declared(GROUP, [str(archive)])


def test_a_daemon_without_plugins_never_imports_importlib_metadata() -> None:
    probe = (
        "import sys\n"
        "from toold_daemon.config import DaemonConfig\n"
        "from toold_daemon.tools.plugin_loader import load_plugins\n"
        "assert load_plugins(DaemonConfig(), set()) == ([], [])\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    if _group_declared(GROUP):
        pytest.skip("a plugin is installed in this environment")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
