"""The spawner (root, in the usual install) is forked from the daemon's first process
once the command line and the configuration are read. What is loaded by then is what
the spawner carries for its whole life: the protocol process's ZeroMQ and the service
that serves clients must load only after the fork, in the protocol process alone."""

from __future__ import annotations

import json
import subprocess
import sys

_BEFORE_THE_FORK = """
import argparse, json, sys
import toold_daemon.cli as cli
from toold_daemon.config import Config
from toold_daemon.tools.builtin import builtin_tools

# What main() does before it forks the spawner: the tools and the spawner's admission.
builtin_tools()
cli.admission_for(argparse.Namespace(root=[], endpoint=""), Config())
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_before_the_fork() -> set[str]:
    out = subprocess.run([sys.executable, "-c", _BEFORE_THE_FORK], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_spawner_is_forked_before_zeromq_and_the_service_load() -> None:
    loaded = _loaded_before_the_fork()
    assert "toold_daemon.cli" in loaded and "toold_daemon.isolation.spawner" in loaded  # (the test ran)
    assert not {m for m in loaded if m == "zmq" or m.startswith("zmq.")}
    assert not {m for m in loaded if m.startswith(("toold_daemon.service", "toold_daemon.server"))}
