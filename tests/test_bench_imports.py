"""The benchmarks are not run by the suite (they time things), but each still imports:
one that names a module or function the code no longer has breaks unseen otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("module", sorted(p.stem for p in BENCH.glob("bench_*.py")))
def test_benchmark_imports(module: str) -> None:
    out = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=BENCH, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
