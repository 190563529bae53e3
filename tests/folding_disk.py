"""A disk that folds case, for tests: a FAT image mounted through FUSE (fusefat).

On it ``.ENV`` opens ``.env``, as on vfat, exfat, a shared host folder or an ext4
directory with ``casefold``; this machine's kernel offers none of those itself. The test
is skipped (with the reason) where FUSE, fusefat or mkfs.vfat is missing:
``./scripts/bootstrap --dev`` installs the last two where it can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

IMAGE_BYTES = 32 << 20


@contextmanager
def fat_disk(directory: Path) -> Iterator[Path]:
    """A fresh FAT file system mounted at ``directory/fat``, unmounted afterwards."""
    fusefat = shutil.which("fusefat")
    mkfs = shutil.which("mkfs.vfat") or ("/usr/sbin/mkfs.vfat" if os.path.exists("/usr/sbin/mkfs.vfat") else None)
    if fusefat is None or mkfs is None or not os.path.exists("/dev/fuse"):
        pytest.skip("no FUSE FAT here (fusefat, mkfs.vfat and /dev/fuse are needed)")
    image, mount = directory / "fat.img", directory / "fat"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(IMAGE_BYTES)
    subprocess.run([mkfs, str(image)], check=True, capture_output=True)
    mounted = subprocess.run([fusefat, "-o", "rw+", str(image), str(mount)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"fusefat could not mount a FAT image: {mounted.stderr.strip()[:200]}")
    try:
        yield mount
    finally:
        unmount = shutil.which("fusermount") or shutil.which("fusermount3")
        done = unmount is not None and subprocess.run([unmount, "-u", str(mount)], capture_output=True).returncode == 0
        if not done:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def folds_case(directory: Path) -> bool:
    """Whether ``directory`` opens a file by its name in another case."""
    probe = directory / ".case-probe"
    probe.write_text("x")
    try:
        return (directory / ".CASE-PROBE").exists()
    finally:
        probe.unlink()
