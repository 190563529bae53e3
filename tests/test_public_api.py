"""Each package's public surface is a small sorted ``__all__``, and dependency directions hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)


@pytest.mark.parametrize("module", ["toold_protocol", "toold_client", "toold_daemon"])
def test_all_is_sorted_and_importable(module: str) -> None:
    mod = __import__(module)
    names = list(mod.__all__)
    assert names == sorted(names, key=lambda n: (not n.isupper(), n)) or names == sorted(names)
    for name in names:
        assert hasattr(mod, name), name


def imported_top_levels(location: Path) -> set[str]:
    """Top-level modules imported (absolutely) by a file, or by every file below a folder."""
    found: set[str] = set()
    for path in [location] if location.is_file() else location.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_protocol_depends_on_msgspec_only() -> None:
    foreign = imported_top_levels(REPO / "protocol/src/toold_protocol") - STDLIB - {"msgspec", "toold_protocol"}
    assert foreign == set()


# Optional imports of the client, each in one module: trio only once a trio loop is
# running (the async client's loop shim), the MCP SDK and anyio only in the MCP bridge's modules
# (the `toold-client[mcp]` extra).
OPTIONAL_CLIENT_IMPORTS = {
    "_aio.py": {"trio"},
    **{name: {"mcp", "anyio"} for name in ("mcp_bridge.py", "mcp_stdio.py", "_mcp_v1.py", "_mcp_v2.py")},
}


def test_client_never_imports_trio_or_the_daemon() -> None:
    allowed = {"msgspec", "zmq", "toold_protocol", "toold_client", "argcomplete"}
    for path in (REPO / "client/src/toold_client").rglob("*.py"):
        foreign = imported_top_levels(path) - STDLIB - allowed - OPTIONAL_CLIENT_IMPORTS.get(path.name, set())
        assert foreign == set(), path.name
    code = (
        "import sys, toold_client, toold_client.cli; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('trio', 'toold_daemon', 'psutil', 'httpx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_protocol_process_does_not_import_what_only_tools_use() -> None:
    """The HTTP stack, jsonschema and the HTML parser load where tools run (a worker, warmed
    in the spawner) or at first use, not at every start of the protocol process."""
    code = (
        "import sys, toold_daemon.cli, toold_daemon.server\n"
        "from toold_daemon.tools.builtin import builtin_tools\n"
        "from toold_daemon.config import Config\n"
        "[(t.unavailable(Config()), t.summary) for t in builtin_tools()]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'httpcore', 'jsonschema', 'selectolax')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_toolctl_does_not_load_what_it_does_not_use() -> None:
    """asyncio (the async client, pyzmq's monitor helper) and importlib.metadata (the
    version) cost every ``toolctl`` start ~40 ms; it loads them only when they are used."""
    code = (
        "import sys, toold_client.cli\n"
        "from toold_client import Client\n"
        "print(sorted(m for m in ('asyncio', 'importlib.metadata', 'toold_client._async_client') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_ipc_imports_zmq_in_the_daemon() -> None:
    files = (REPO / "daemon/src/toold_daemon").rglob("*.py")
    assert [path.name for path in files if "zmq" in imported_top_levels(path)] == ["ipc.py"]


def test_default_endpoint_agrees_with_the_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from toold_daemon.config import Config
    from toold_daemon.server import ServeOptions, resolve_endpoint
    from toold_protocol import default_endpoint

    monkeypatch.delenv("TOOLD_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert resolve_endpoint(Config(), ServeOptions()) == default_endpoint() == f"ipc://{tmp_path}/toold/toold.sock"
    assert (tmp_path / "toold").stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    expected = default_endpoint()
    assert expected.endswith("/toold.sock")
    assert resolve_endpoint(Config(), ServeOptions()) == expected


# The daemon's folders in layers, from the entry points down: a module imports (at run
# time) only from its own layer or the layers below. Each unit is a folder or a module
# of the daemon package; a module named on its own (``config.loading``) is placed apart
# from its folder.
DAEMON_LAYERS: list[set[str]] = [
    {"__main__", "program", "cli", "server"},  # the entry points, which wire the parts together
    {"service", "operation", "config.loading", "config.problems"},  # serving clients; operating the service
    {"policy"},  # deciding: planning a batch, the policy, confirmations
    {"execution", "isolation", "egress", "mcp"},  # running: the executor and where tools run
    {"tools", "undo", "patches", "web", "plugins", "records"},  # the tools, and what is recorded
    {
        "sandbox",
        "config",
        "errors",
        "output",
        "redaction",
        "regexguard",
        "globmatch",
        "pool_shares",
        "__init__",
    },  # vocabulary
]


def _daemon_unit(module: str) -> str:
    """The layer unit of a module of the daemon package (dotted, without the package)."""
    return next(
        (unit for layer in DAEMON_LAYERS for unit in layer if "." in unit and module.startswith(unit)),
        module.split(".", maxsplit=1)[0] or "__init__",
    )


def _runtime_imports(path: Path, package: list[str]) -> set[str]:
    """Modules of the daemon package a file imports, outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
        for child in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.add(".".join([*base, *node.module.split(".")]))
            else:
                found.update(".".join([*base, alias.name]) for alias in node.names)
        elif node.module and node.module.startswith("toold_daemon."):
            found.add(node.module.removeprefix("toold_daemon."))
    return found


def test_daemon_imports_run_down_its_layers() -> None:
    root = REPO / "daemon/src/toold_daemon"
    layer_of = {unit: depth for depth, layer in enumerate(DAEMON_LAYERS) for unit in layer}
    wrong: list[str] = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[:-1]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        unit = _daemon_unit(module)
        assert unit in layer_of, f"{path.relative_to(root)}: place {unit!r} in a layer of DAEMON_LAYERS"
        for imported in _runtime_imports(path, package):
            target = _daemon_unit(imported)
            if layer_of.get(target, len(DAEMON_LAYERS)) < layer_of[unit]:
                wrong.append(f"{module} ({unit}) imports {imported} ({target}), a layer above it")
    assert wrong == []


#: Imports each module of a package first, in one interpreter: the package's modules
#: are forgotten before each, the libraries they use are not. Prints the failures.
_EACH_MODULE_FIRST = """
import importlib, pathlib, sys
package = sys.argv[1]
root = pathlib.Path(importlib.import_module(package).__file__).parent
failed = []
for path in sorted(root.rglob("*.py")):
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__main__":
        continue
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
"""


@pytest.mark.parametrize("package", ["toold_protocol", "toold_client", "toold_daemon"])
def test_every_module_imports_first(package: str) -> None:
    """A module that fails when it is the first of its package to be imported has an
    import circle through a package's ``__init__`` (``undo.restore`` had one with
    ``tools``), which the layer test above cannot see: layers allow imports within one."""
    out = subprocess.run([sys.executable, "-c", _EACH_MODULE_FIRST, package], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
