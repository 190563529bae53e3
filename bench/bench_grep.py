"""grep on a large generated tree: the grep tool through the client vs ripgrep run directly.

The baseline is ``rg -n`` run directly from a fresh process, as a shell user would
(all cores, output in no particular order); the tool returns the same hits in path
order. Target: tool p50 <= 1.2x ripgrep p50.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import report, running_daemon, sample
from toold_client import Client
from toold_daemon.tools.grep import RIPGREP_FLAGS, find_ripgrep

WORDS = ["alpha", "beta", "gamma", "delta", "needle", "omega", "theta", "kappa", "lambda", "sigma"]


def make_tree(root: Path, files: int, lines: int) -> None:
    rng = random.Random(42)
    for i in range(files):
        directory = root / f"pkg{i % 50}" / f"mod{i % 7}"
        directory.mkdir(parents=True, exist_ok=True)
        text = "\n".join(" ".join(rng.choice(WORDS[:4] + WORDS[5:]) for _ in range(8)) for _ in range(lines))
        if i % 97 == 0:
            text += "\nthe needle is here\n"
        (directory / f"file{i}.py").write_text(text + "\n")
    (root / ".gitignore").write_text("*.log\n")


_CONFINED_LOOP = """
import json, os, subprocess, sys, time
from toold_daemon.isolation import confine, kernel
cmd, root, n = json.loads(sys.argv[1])
kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
ruleset = confine.landlock_ruleset([root], [], network=False, tools_only=True)
if isinstance(ruleset, str) or kernel.seccomp_supported() is not None:
    print("[]")
    raise SystemExit
confine._apply_landlock(ruleset)
kernel.seccomp_filter(sockets="none")
env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
times = []
for i in range(n + 3):
    started = time.perf_counter()
    subprocess.run(cmd, cwd=root, capture_output=True, env=env, check=False)
    times.append(time.perf_counter() - started)
print(json.dumps(times[3:]))
"""


def confined_rg(cmd: list[str], root: Path, n: int) -> list[float]:
    """``cmd`` timed from a process under the kernel confinement a tool worker has
    (Landlock on the root, seccomp), which the tool pays and ``rg`` run directly does
    not: what the confinement itself costs. Empty where the kernel lacks either."""
    out = subprocess.run(
        [sys.executable, "-c", _CONFINED_LOOP, json.dumps([cmd, str(root), n])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    times: list[float] = json.loads(out)
    return times


def main(files: int = 3_000, lines: int = 270, n: int = 30) -> None:
    rg = find_ripgrep()
    if rg is None:
        print("ripgrep not found; nothing to compare against")
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        make_tree(root, files, lines)
        size = sum(p.stat().st_size for p in root.rglob("*.py"))
        plain = [rg, "-n", "needle", "."]  # what a person types: all cores, no order
        direct = sample(lambda: subprocess.run(plain, cwd=root, capture_output=True, check=True), n, warmup=3)
        cmd = [rg, *RIPGREP_FLAGS, "--sort=path", "--case-sensitive", "--regexp", "needle", "--", "."]
        ordered = sample(lambda: subprocess.run(cmd, cwd=root, capture_output=True, check=True), n, warmup=3)
        with running_daemon(root) as endpoint, Client(endpoint) as client:

            def tool() -> None:
                result = client.call("grep", {"pattern": "needle", "max_results": 10_000})
                assert result.ok and result.content.count("\n") + 1 == (files + 96) // 97

            via_tool = sample(tool, n, warmup=3)
        print(f"# grep over {files} files, {size / 1e6:.1f} MB, n={n}")
        report("rg -n direct [baseline]", direct)
        report("rg direct, --sort=path (one thread)", ordered, direct)
        unsorted = [rg, *RIPGREP_FLAGS, "--case-sensitive", "--regexp", "needle", "--", "."]  # as the tool runs it
        confined = confined_rg(unsorted, root, n)
        report("grep tool via Client.call", via_tool, direct)
        if confined:
            report("rg under a worker's Landlock+seccomp", confined, direct)
            report("grep tool vs that confined rg", via_tool, confined)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
