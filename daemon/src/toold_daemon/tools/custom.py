"""Tools the administrator adds in the configuration: command tools and definitions.

A command tool (``[[tools.commands]]``) runs a program exactly like ``shell`` does
(confined child, limits, streaming, kill on timeout, policy, confirmations), with its
arguments checked against the entry's JSON Schema by a real validator and placed into
``argv`` elements: never through a shell, so ``; touch pwned`` or ``$(...)`` in a value
is just text. A definition (``[[tools.definitions]]``) is advertised in parse-only
mode, where a person supplies each result.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from typing import TYPE_CHECKING, Any, ClassVar

from toold_protocol import ToolErrorType

from ..config import CommandToolConfig, DefinitionConfig, ToolsConfig
from ..errors import ToolError, bad_args
from ..sandbox.environment import DEFAULT_PATH, acceptable
from ._base import Command, Tool, ToolContext, ToolOutput
from ._data import CommandData

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_ERRORS_SHOWN = 3


class SchemaTool(Tool[Any]):
    """A tool whose arguments are a JSON object checked against ``json_schema``."""

    args_type = dict[str, Any]
    validator: ClassVar[Draft202012Validator]

    def validate(self, args: Any) -> None:
        errors = sorted(self.validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            shown = "; ".join(_describe(e.absolute_path, e.message) for e in errors[:MAX_ERRORS_SHOWN])
            more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
            raise bad_args(f"invalid arguments for {self.name}: {shown}{more}")


def _describe(path: Any, message: str) -> str:
    where = ".".join(str(p) for p in path)
    return f"{where}: {message}" if where else message


class DefinedTool(SchemaTool):
    """Parse-only: the daemon validates and records the call; a person supplies the result."""

    def run(self, args: Any, ctx: ToolContext) -> ToolOutput:
        raise bad_args(f"{self.name} is a definition only: its results are supplied in parse-only mode")


class CommandTool(SchemaTool):
    data_type = CommandData
    entry: ClassVar[CommandToolConfig]
    timeout_kind = "shell"

    def summary(self, args: Any) -> str:
        try:
            shown = shlex.join(self._argv(args))
        except Exception:
            shown = self.name
        return shown if len(shown) <= 200 else shown[:199] + "…"

    def timeout_seconds(self, args: Any) -> float | None:
        return self.entry.timeout_seconds

    def command(self, args: Any, ctx: ToolContext) -> Command | None:
        root = ctx.sandbox.working_dir
        cwd = ctx.sandbox.resolve(self.entry.cwd) if self.entry.cwd else root
        argv = self._argv(args)
        program = argv[0] if argv[0].startswith("/") else shutil.which(argv[0], path=DEFAULT_PATH)
        if program is None:
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "PROGRAM_NOT_FOUND", f"{argv[0]} is not on {DEFAULT_PATH}")
        env = acceptable(self.entry.env)
        return Command(argv=[program, *argv[1:]], cwd=str(cwd), network=self.entry.network, env=env)

    def _argv(self, args: dict[str, Any]) -> list[str]:
        """``argv`` with each ``{param}`` replaced; an element that is only a placeholder
        of a missing optional argument is left out. A value that would start an element
        with ``-`` is refused unless a ``--`` element comes first (it would be an option)."""
        argv: list[str] = []
        options_end = False
        for element in self.entry.argv:
            names = _PLACEHOLDER.findall(element)
            if names and element == "{" + names[0] + "}" and names[0] not in args:
                continue
            value = _PLACEHOLDER.sub(lambda m: _text(args.get(m.group(1))), element)
            if "\0" in value:  # no program can receive it: say so instead of failing to start
                raise bad_args(f"{names[0] if names else 'argv'}: a NUL character cannot be passed to a program")
            if names and not options_end and value.startswith("-") and not element.startswith("-"):
                raise bad_args(f"{names[0]}: a value starting with '-' would be read as an option ({value[:40]!r})")
            options_end = options_end or element == "--"
            argv.append(value)
        return argv


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def command_tool(entry: CommandToolConfig) -> Tool[Any]:
    return _schema_tool(
        CommandTool,
        entry,
        entry=entry,
        risk=entry.risk,
        side_effecting=entry.side_effecting,
        output="data: {exit_code}; the program's output is the content",
    )


def definition_tool(entry: DefinitionConfig) -> Tool[Any]:
    return _schema_tool(DefinedTool, entry)


def _schema_tool(base: type[SchemaTool], definition: DefinitionConfig, **extra: Any) -> Tool[Any]:
    """A tool of its own class (tool attributes are class attributes) for one entry."""
    attributes = {
        "name": definition.name,
        "description": definition.description,
        "json_schema": definition.parameters,
        "validator": _validator(definition.parameters),
        **extra,
    }
    tool: Tool[Any] = type(f"{base.__name__}_{definition.name}", (base,), attributes)()
    return tool


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    """jsonschema is imported when a configuration has tools with schemas (a tenth of
    a second of every start otherwise)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema)


def taken_names(tools: ToolsConfig) -> set[str]:
    """Names and aliases of the built-in tools and of the configured ones: a plugin may
    take none of them, and a configured tool none of the built-ins'."""
    from .builtin import builtin_tools

    names = {name for tool in builtin_tools() for name in (tool.name, *tool.aliases)}
    return names | {entry.name for entry in (*tools.commands, *tools.definitions)}


def configured_tools(tools: ToolsConfig) -> list[Tool[Any]]:
    """The command tools, and in parse-only mode the definitions."""
    made = [command_tool(entry) for entry in tools.commands]
    if tools.mode == "parse_only":
        made += [definition_tool(entry) for entry in tools.definitions]
    return made


def problems(tools: ToolsConfig) -> list[tuple[str, int, str]]:
    """What is wrong with the configured tools: (TOML header, index under it, message)."""
    taken = taken_names(ToolsConfig())  # the built-ins alone: each entry adds its own below
    found: list[tuple[str, int, str]] = []
    entries: list[tuple[str, int, DefinitionConfig]] = [
        *(("[[tools.commands]]", i, e) for i, e in enumerate(tools.commands)),
        *(("[[tools.definitions]]", i, e) for i, e in enumerate(tools.definitions)),
    ]
    for header, index, entry in entries:
        what = f"{header.strip('[]')} {entry.name!r}"
        if entry.name in taken:
            found.append((header, index, f"{what}: the name is already taken by another tool"))
        taken.add(entry.name)
        found.extend((header, index, f"{what}: {message}") for message in _schema_problems(entry.parameters))
        if isinstance(entry, CommandToolConfig):
            if "/" in entry.argv[0] and not entry.argv[0].startswith("/"):
                found.append((header, index, f"{what}: argv[0] must be a program's name or an absolute path"))
            declared = set(entry.parameters.get("properties", {}) or {})
            for element in entry.argv:
                for name in _PLACEHOLDER.findall(element):
                    if name not in declared:
                        found.append((header, index, f"{what}: argv names {{{name}}}, which is not a parameter"))
    return found


def _schema_problems(schema: dict[str, Any]) -> list[str]:
    if schema.get("type") != "object":
        return ['parameters must be an object schema ({"type": "object", "properties": {...}})']
    if not isinstance(schema.get("properties", {}), dict):
        return ["parameters.properties must be a table of parameter schemas"]
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [f"parameters is not a valid JSON Schema: {exc.message}"]
    return []
