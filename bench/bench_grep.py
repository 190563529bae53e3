"""grep on a large generated tree: the grep tool through the client vs ripgrep run directly.

The baseline is ``rg -n`` run directly from a fresh process, as a shell user would
(all cores, output in no particular order); the tool returns the same hits in path
order, so it is also compared with ``rg -n --sort=path``, which prints them in that
order (on one thread). Target: tool p50 <= 1.1x ripgrep p50. The four are timed in turn, round by round,
so that the machine's drift cannot land on one of them alone.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from _common import report, running_daemon, sample_interleaved
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


_CONFINED_SERVER = """
import json, subprocess, sys
from toold_daemon.isolation import confine, kernel
cmd, root = json.loads(sys.argv[1])
kernel.prctl(kernel.PR_SET_NO_NEW_PRIVS, 1)
ruleset = confine.landlock_ruleset([root], [], network=False, tools_only=True)
if isinstance(ruleset, str) or kernel.seccomp_supported() is not None:
    print("unsupported", flush=True)
    raise SystemExit
confine._apply_landlock(ruleset)
kernel.seccomp_filter(sockets="none")
env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
print("ready", flush=True)
for _ in sys.stdin:
    subprocess.run(cmd, cwd=root, capture_output=True, env=env, check=False)
    print("done", flush=True)
"""


class ConfinedRipgrep:
    """A process under the kernel confinement a tool worker has (Landlock on the root,
    seccomp) that runs ``cmd`` each time it is asked: what the confinement itself costs,
    which the tool pays and ``rg`` run directly does not. ``available`` is False where
    the kernel lacks either."""

    def __init__(self, cmd: list[str], root: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CONFINED_SERVER, json.dumps([cmd, str(root)])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        self.available = self._stdout.readline().strip() == "ready"

    def run(self) -> None:
        self._stdin.write("go\n")
        self._stdin.flush()
        self._stdout.readline()

    def close(self) -> None:
        self._stdin.close()
        self._proc.wait()


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
        ordered = [rg, "-n", "--sort=path", "needle", "."]  # the same, in the tool's order (one thread)
        unsorted = [rg, *RIPGREP_FLAGS, "--case-sensitive", "--regexp", "needle", "--", "."]  # as the tool runs it
        confined = ConfinedRipgrep(unsorted, root)
        with running_daemon(root) as endpoint, Client(endpoint) as client:

            def tool() -> None:
                result = client.call("grep", {"pattern": "needle", "max_results": 10_000})
                assert result.ok and result.content.count("\n") + 1 == (files + 96) // 97

            contenders: dict[str, Callable[[], object]] = {
                "direct": lambda: subprocess.run(plain, cwd=root, capture_output=True, check=True),
                "ordered": lambda: subprocess.run(ordered, cwd=root, capture_output=True, check=True),
                "tool": tool,
            }
            if confined.available:
                contenders["confined"] = confined.run
            times = sample_interleaved(contenders, n)
        confined.close()
        print(f"# grep over {files} files, {size / 1e6:.1f} MB, n={n}, rounds interleaved")
        report("rg -n direct [baseline]", times["direct"])
        report("rg -n --sort=path direct (one thread)", times["ordered"], times["direct"])
        report("grep tool via Client.call", times["tool"], times["direct"])
        report("grep tool vs rg -n in its order", times["tool"], times["ordered"])
        if "confined" in times:
            report("rg under a worker's Landlock+seccomp", times["confined"], times["direct"])
            report("grep tool vs that confined rg", times["tool"], times["confined"])


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
