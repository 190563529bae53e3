"""A third-party MCP server's tools as registry tools, and their results as ours.

What a server says about its tools is untrusted: a name outside ``[A-Za-z0-9_-]``, a
schema that is not a valid JSON Schema object or a description past a few kilobytes
is refused or cut (the reason is kept for ``toold doctor`` and the logs), and
annotations count only where the administrator set ``trust_annotations``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from toold_protocol import ToolErrorType

from ..config import McpServerConfig
from ..errors import ToolError
from ..tools._base import ToolOutput
from ..tools.custom import SchemaTool

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

PREFIX = "mcp__"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_DESCRIPTION_CHARS = 4096
MAX_TOOLS_PER_SERVER = 256  # a server listing more is cut (the registry is shared by everyone)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def qualified(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def server_of(name: str) -> str | None:
    """The server part of ``mcp__{server}__{tool}``, or None for any other name."""
    if not name.startswith(PREFIX):
        return None
    server, separator, tool = name[len(PREFIX) :].partition("__")
    return server if separator and server and tool else None


class McpTool(SchemaTool):
    """A tool of a configured MCP server: planned, judged, journaled like any other; run
    by the gateway on the instance of its server for the caller's uid and workspace."""

    server: ClassVar[McpServerConfig]
    remote_name: ClassVar[str]
    timeout_kind = "shell"

    def timeout_seconds(self, args: Any) -> float | None:
        return self.server.timeout_seconds

    def summary(self, args: Any) -> str:
        shown = f"{self.name} {_brief(args)}"
        return shown if len(shown) <= 200 else shown[:199] + "…"


class Discovered(msgspec.Struct, frozen=True):
    tools: list[type[McpTool]]
    skipped: list[str]  # why each refused tool was refused


def tools_of(server: McpServerConfig, listed: Any) -> Discovered:
    """Our tool classes for a ``tools/list`` result's ``tools`` (anything at all)."""
    made: list[type[McpTool]] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict):
            skipped.append("an entry that is not an object")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            skipped.append(f"a tool named {str(name)[:80]!r}: names are 1-64 of [A-Za-z0-9_-]")
            continue
        if name in seen:
            skipped.append(f"{name}: listed twice")
            continue
        if len(made) >= MAX_TOOLS_PER_SERVER:
            skipped.append(f"{name} and the rest: more than {MAX_TOOLS_PER_SERVER} tools")
            break
        schema = entry.get("inputSchema")
        problem = _schema_problem(schema)
        if problem:
            skipped.append(f"{name}: {problem}")
            continue
        seen.add(name)
        made.append(_tool_class(server, name, entry, schema))
    return Discovered(made, skipped)


def _tool_class(server: McpServerConfig, name: str, entry: dict[str, Any], schema: Any) -> type[McpTool]:
    description = entry.get("description")
    text = _CONTROL.sub(" ", description if isinstance(description, str) else "")[:MAX_DESCRIPTION_CHARS]
    annotations = entry.get("annotations") if server.trust_annotations else None
    annotations = annotations if isinstance(annotations, dict) else {}
    read_only = annotations.get("readOnlyHint") is True
    destructive = annotations.get("destructiveHint") is True
    attributes = {
        "name": qualified(server.name, name),
        "description": f"[MCP server {server.name}] {text}".strip(),
        "json_schema": schema,
        "validator": _validator(schema),
        "server": server,
        "remote_name": name,
        "side_effecting": not read_only,
        "risk": "high" if destructive else server.risk,
        "network": server.network,
        "output": "data: the server's structuredContent, when it sends one",
    }
    return type(f"McpTool_{server.name}_{name}", (McpTool,), attributes)


def _validator(schema: Any) -> Draft202012Validator:
    from jsonschema import Draft202012Validator  # only once a server lists tools

    return Draft202012Validator(schema)


def _schema_problem(schema: Any) -> str:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its inputSchema is not an object schema"
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"its inputSchema is not a valid JSON Schema: {exc.message[:200]}"
    except RecursionError:
        return "its inputSchema nests too deeply"
    return ""


def output_of(result: dict[str, Any]) -> ToolOutput:
    """A ``tools/call`` result as our output; ``isError`` as a ToolError carrying the text."""
    blocks = result.get("content")
    text = "\n".join(_text_of(item) for item in (blocks if isinstance(blocks, list) else []) if isinstance(item, dict))
    structured = result.get("structuredContent")
    data = structured if isinstance(structured, dict) else None
    if result.get("isError") is True:
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED,
            "MCP_TOOL_ERROR",
            f"the MCP server reported an error: {text[:500]}" if text else "the MCP server reported an error",
            output=text or None,
        )
    if not text and data is not None:
        import json

        text = json.dumps(data, ensure_ascii=False)
    return ToolOutput(text, data=data)


def _text_of(item: dict[str, Any]) -> str:
    """One content block as text: text as is, anything else described (never its bytes)."""
    kind = item.get("type")
    if kind == "text":
        text = item.get("text")
        return text if isinstance(text, str) else ""
    if kind in ("image", "audio"):
        data = item.get("data")
        size = len(data) * 3 // 4 if isinstance(data, str) else 0
        return f"[{kind} {str(item.get('mimeType'))[:60]}, about {size} bytes, not shown]"
    if kind == "resource":
        resource = item.get("resource")
        if isinstance(resource, dict) and isinstance(resource.get("text"), str):
            return str(resource["text"])
        uri = resource.get("uri") if isinstance(resource, dict) else None
        return f"[resource {str(uri)[:300]}, not shown]"
    if kind == "resource_link":
        return f"[resource link {str(item.get('uri'))[:300]}]"
    return f"[{str(kind)[:40]} content, not shown]"


def _brief(args: Any) -> str:
    if not isinstance(args, dict):
        return ""
    parts = [f"{key}={str(value)[:60]!s}" for key, value in list(args.items())[:4]]
    return " ".join(parts).replace("\n", " ")
