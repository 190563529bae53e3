"""Reading a configuration: a file (and the policy file it names) decoded into ``Config``,
with every problem reported at its file and line. The data types and their own checks
live in ``config``; the checks that need the policy engine or the tools live here,
beside the code that loads, so the types import nothing of what uses them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import msgspec

from ..policy import problems as policy_problems
from ..tools.custom import problems as tool_problems
from . import ApprovalConfig, Config, ConfigError
from .problems import problems as structural_problems

T = TypeVar("T")


def parse(text: str, source: str = "<config>") -> Config:
    """The configuration in ``text``; ConfigError lists every problem, a line each."""
    config = _decode(text, source, Config)
    refusals = []
    try:
        check_policy(config.tools.approval, text, source, header="[[tools.approval.rules]]")
    except ConfigError as exc:
        refusals.append(str(exc))
    try:
        check_custom_tools(config, text, source)
    except ConfigError as exc:
        refusals.append(str(exc))
    if refusals:
        raise ConfigError("\n".join(refusals))
    return config


def check_custom_tools(config: Config, text: str, source: str) -> None:
    """Raise ConfigError naming ``source:line`` of each command tool or definition that
    clashes with another tool, has a schema that is not an object schema, or names a
    parameter in ``argv`` that it does not declare."""
    found = tool_problems(config.tools)
    if not found:
        return
    located = []
    for header, index, message in found:
        starts = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip().replace(" ", "") == header]
        located.append(f"{source}:{starts[index] if index < len(starts) else '?'}: {message}")
    raise ConfigError("; ".join(located))


def parse_policy(text: str, source: str) -> ApprovalConfig:
    """A policy file: the keys of ``[tools.approval]`` at top level, rules as ``[[rules]]``."""
    approval = _decode(text, source, ApprovalConfig)
    check_policy(approval, text, source, header="[[rules]]")
    return approval


def _decode(text: str, source: str, kind: type[T]) -> T:
    try:
        return msgspec.toml.decode(text, type=kind)
    except msgspec.ValidationError as exc:
        first = str(exc)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    found = structural_problems(msgspec.toml.decode(text), kind) or [("", first)]
    located = [_locate(text, source, f"{message} - at `{path}`" if path else message) for path, message in found]
    raise ConfigError("\n".join(located))


def check_policy(approval: ApprovalConfig, text: str, source: str, *, header: str) -> None:
    """Raise ConfigError naming ``source:line`` of each rule whose regexes or examples fail."""
    found = policy_problems(approval)
    if not found:
        return
    starts = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip().replace(" ", "") == header]
    located = [f"{source}:{starts[i] if i < len(starts) else '?'}: {message}" for i, message in found]
    raise ConfigError("policy refused: " + "; ".join(located))


def load_file(path: Path) -> Config:
    """The configuration in ``path``, and the policy file it names (``[daemon] policy_file``,
    relative to the configuration's directory), which then replaces ``[tools.approval]``."""
    config = parse(_read(path), str(path))
    if not config.daemon.policy_file:
        return config
    policy_path = path.parent / config.daemon.policy_file
    approval = parse_policy(_read(policy_path), str(policy_path))
    return msgspec.structs.replace(config, tools=msgspec.structs.replace(config.tools, approval=approval))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def _locate(text: str, source: str, message: str) -> str:
    """Prefix a msgspec validation message with ``file:line`` of the offending key."""
    unknown = re.search(r"unknown field `([^`]+)`", message)
    at = re.search(r"at `\$\.([^`]+)`", message)
    key = unknown.group(1) if unknown else (at.group(1).split(".")[-1] if at else None)
    if key is not None:
        key = re.sub(r"\[\d+\]$", "", key)
        pattern = re.compile(rf"^\s*(\[+\s*)?([\w.\"-]*\.)?\"?{re.escape(key)}\"?\s*(=|\]|\.)")
        lines = text.splitlines()
        start = _element_start(lines, at.group(1)) if at else 0
        for number, line in enumerate(lines[start:], start=start + 1):
            if pattern.search(line):
                return f"{source}:{number}: {message}"
    return f"{source}: {message}"


def _element_start(lines: list[str], path: str) -> int:
    """The line (from 0) of the ``[[table]]`` header of the last array element in
    ``path`` (``tools.approval.rules[2].decision``: the third ``[[tools.approval.rules]]``),
    so a key is looked for in its own element; 0 when the path holds none."""
    elements = list(re.finditer(r"([\w.]+)\[(\d+)\]", path))
    if not elements:
        return 0
    element = elements[-1]
    header = f"[[{element.group(1)}]]"
    starts = [n for n, line in enumerate(lines) if line.strip().replace(" ", "") == header]
    index = int(element.group(2))
    return starts[index] if index < len(starts) else 0
