"""What keeps the daemon's start short: no dataclasses in its modules, no regular
expression whose classes span most of Unicode, and the garbage collector off while they
load but on for every command once it runs."""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import pkgutil
import py_compile
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from toold_daemon.operation import bytecode
from toold_daemon.server import settle_garbage_collector

#: The parser re compiles with (typeshed does not describe it).
_parser: Any = importlib.import_module("re._parser")
DAEMON = Path(__file__).resolve().parents[2] / "daemon/src/toold_daemon"


def test_the_daemon_defines_no_dataclasses() -> None:
    """Python 3.11 compiles every dataclass's generated methods at import (about half a
    millisecond each, 41 ms for the 71 the daemon had); a msgspec Struct is made in C."""
    users = [path.relative_to(DAEMON).as_posix() for path in DAEMON.rglob("*.py") if _imports_dataclasses(path)]
    assert users == []


def _imports_dataclasses(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "dataclasses":
            return True
        if isinstance(node, ast.Import) and any(alias.name == "dataclasses" for alias in node.names):
            return True
    return False


def test_no_module_level_pattern_spans_most_of_unicode() -> None:
    """``re`` compiles a character class by visiting every code point of its ranges:
    ``[\\x80-\\U0010ffff]`` took 3-6 ms, paid at every start. ``[^\\x00-\\x7f]`` means the
    same and costs a tenth of a millisecond."""
    wide = {
        f"{module.__name__}.{name}": width
        for module in _modules("toold_protocol", "toold_client", "toold_daemon")
        for name, value in vars(module).items()
        if isinstance(value, re.Pattern)
        and isinstance(value.pattern, str)
        and (width := _class_width(_parser.parse(value.pattern, value.flags))) > 65_536
    }
    assert wide == {}


def _modules(*packages: str) -> list[ModuleType]:
    found = []
    for package in packages:
        top = importlib.import_module(package)
        for info in pkgutil.walk_packages(top.__path__, f"{package}."):
            if not info.name.endswith("__main__"):  # running it would start the program
                found.append(importlib.import_module(info.name))
    return found


def _class_width(items: Any) -> int:  # re's parse tree is untyped
    """How many code points the ranges of the pattern's character classes cover, in all."""
    total = 0
    for op, av in items:
        if op is _parser.IN:
            total += sum(arg[1] - arg[0] for kind, arg in av if kind is _parser.RANGE)
        elif op is _parser.SUBPATTERN:
            total += _class_width(av[-1])
        elif op in (_parser.MAX_REPEAT, _parser.MIN_REPEAT, _parser.POSSESSIVE_REPEAT):
            total += _class_width(av[2])
        elif op is _parser.BRANCH:
            total += sum(_class_width(branch) for branch in av[1])
        elif op in (_parser.ASSERT, _parser.ASSERT_NOT):
            total += _class_width(av[1])
        elif op is _parser.ATOMIC_GROUP:
            total += _class_width(av)
    return total


def test_the_daemon_starts_from_current_bytecode() -> None:
    """``scripts/bootstrap`` compiles our sources, which pip installed editable and so
    compiled none of: where PYTHONDONTWRITEBYTECODE is set, every daemon start compiled
    them all again (its imports took twice as long). Fails after a source changes until
    bootstrap (``./scripts/test`` runs it first) compiles it again."""
    trees = [DAEMON, *(DAEMON.parents[2] / f"{name}/src" for name in ("protocol", "client"))]
    missing = bytecode.stale(source for tree in trees for source in tree.rglob("*.py"))
    assert missing == [], "run ./scripts/bootstrap"


def test_bytecode_is_current_only_for_the_source_it_was_compiled_from(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("VALUE = 1\n")
    assert not bytecode.is_current(source)  # never compiled
    py_compile.compile(str(source), doraise=True)
    assert bytecode.is_current(source)
    source.write_text("VALUE = 22\n")  # another size, so another source even within the same second
    assert not bytecode.is_current(source)
    py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert bytecode.is_current(source)  # hash-based: the import system checks the hash itself
    Path(importlib.util.cache_from_source(str(source))).write_bytes(b"\0" * 16)
    assert not bytecode.is_current(source)  # another interpreter's magic number


def test_settling_freezes_start_up_and_turns_the_collector_on() -> None:
    threshold = gc.get_threshold()
    gc.disable()
    try:
        settle_garbage_collector()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 1000  # the modules and everything start-up built
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.enable()


def _after_program(argv: list[str]) -> str:
    """Run the ``toold`` program's entry with ``argv`` in a fresh interpreter; print
    whether the collector is on once the command has returned."""
    code = (
        "import gc, sys\n"
        f"sys.argv = ['toold', *{argv!r}]\n"
        "from toold_daemon.program import main\n"
        "code = main()\n"
        "print(code, gc.isenabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1]


def test_every_command_but_serve_runs_with_the_collector_on(tmp_path: Path) -> None:
    config = tmp_path / "toold.toml"
    config.write_text("[daemon]\n")
    assert _after_program(["check-config", str(config)]) == "0 True"


def test_the_modules_load_with_the_collector_off() -> None:
    code = (
        "import gc\n"
        "gc.disable()\n"
        "import toold_daemon.cli, toold_daemon.server\n"
        "print(gc.isenabled(), gc.get_count()[0] > 10_000)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]  # importing turns nothing back on
