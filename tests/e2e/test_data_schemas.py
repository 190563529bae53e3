"""Every tool keeps the promise its definition makes about ``data``: each advertised tool
is called for real (every action of the tools that have several), and the ``data`` of
each successful result is checked against the tool's advertised JSON Schema with an
independent validator (``jsonschema``), not with the types the schema came from. A
tool without a case here fails the test, so a new tool must bring one."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.conftest import DaemonProcess, module_daemon
from tests.webserver import Server
from toold_client import APPROVE_ALL

SEARCH = "import json, sys; print(json.dumps([{'title': 'T', 'url': 'https://example.invalid/1', 'snippet': 's'}]))"

CASES: dict[str, list[dict[str, Any]]] = {
    "write_file": [{"path": "notes/a.txt", "content": "one\ntwo\nthree\n"}],
    "read_file": [{"path": "notes/a.txt"}, {"path": "notes/a.txt", "start_line": 2, "end_line": 2}, {"path": "bin"}],
    "read_many_files": [{"paths": ["notes/a.txt", "missing.txt"]}],
    "list_directory": [{"path": ".", "recursive": True}],
    "glob": [{"pattern": "**/*.txt"}],
    "grep": [{"pattern": "two"}],
    "edit_file": [{"path": "notes/a.txt", "edits": [{"target": "three", "replacement": "3"}]}],
    "apply_patch": [{"patch": "*** Begin Patch\n*** Add File: patched.txt\n+hi\n*** End Patch\n"}],
    "move_file": [{"source": "patched.txt", "destination": "moved.txt"}],
    "delete_file": [{"path": "moved.txt"}],
    "shell": [{"command": "echo out; echo err >&2"}, {"command": "sleep 30", "background": True}],
    "shell_jobs": [{"action": "list"}],
    "run_code": [{"language": "python", "code": "print(6 * 7)"}],
    "web_fetch": [],  # filled in with the local server's URL
    "web_search": [{"query": "cats"}],
    "memory": [
        {"action": "set", "key": "k", "value": "v"},
        {"action": "get", "key": "k"},
        {"action": "get", "key": "nothing"},
        {"action": "list"},
        {"action": "delete", "key": "k"},
    ],
    "write_todos": [{"action": "add", "task": "try it"}, {"action": "list"}],
    "word_count": [{"file": "notes/a.txt"}],
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, site: Server) -> Iterator[DaemonProcess]:
    config = f"""
[tools.web]
allowed_networks = ["127.0.0.1/32"]
allowed_ports = [{site.port}]
[tools.web_search]
backend = "command"
command = {json.dumps([sys.executable, "-c", SEARCH])}
[[tools.commands]]
name = "word_count"
description = "Count the words of a file"
argv = ["wc", "-w", "{{file}}"]
parameters.type = "object"
parameters.properties.file.type = "string"
parameters.required = ["file"]
"""
    with module_daemon(tmp_path_factory, "schemas", config) as d:
        (d.root / "bin").write_bytes(bytes(range(256)) * 4)
        yield d


def test_every_tool_advertises_a_data_schema_its_results_keep(daemon: DaemonProcess, site: Server) -> None:
    cases = {**CASES, "web_fetch": [{"url": site.url("/page")}, {"url": site.url("/json"), "max_length": 10}]}
    with daemon.client(timeout=60) as c:
        definitions = {d.name: d for d in c.tools()}
        assert set(definitions) == set(cases), "a tool without a case here, or a case for no tool"
        checked = 0
        for name, calls in cases.items():
            schema = definitions[name].data_schema
            assert schema.get("type") == "object", f"{name} advertises no object schema for its data"
            Draft202012Validator.check_schema(schema)
            validator = Draft202012Validator(schema)
            for arguments in calls:
                result = c.call(name, arguments, on_confirm=lambda _request: APPROVE_ALL)
                assert result.ok, f"{name} {arguments}: {result.content[:300]}"
                errors = sorted(validator.iter_errors(result.data or {}), key=str)
                assert not errors, f"{name} {arguments}: {[e.message for e in errors][:5]} in {result.data}"
                checked += 1
    assert checked >= 25


def test_a_result_with_data_the_schema_does_not_allow_is_caught(daemon: DaemonProcess) -> None:
    """The check above can fail: an extra field, a wrong type and a missing field are
    each refused by the advertised schema."""
    with daemon.client(timeout=30) as c:
        schema = {d.name: d for d in c.tools()}["glob"].data_schema
    validator = Draft202012Validator(schema)
    good = {"matches": ["a.txt"], "count": 1, "truncated": False}
    assert validator.is_valid(good)
    assert not validator.is_valid({**good, "surprise": 1})
    assert not validator.is_valid({**good, "count": "one"})
    assert not validator.is_valid({"matches": [], "truncated": False})
