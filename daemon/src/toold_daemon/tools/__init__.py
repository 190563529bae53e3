"""Built-in tools, one module each. ``builtin_tools`` lists what a daemon registers."""

from __future__ import annotations

from typing import Any

from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from .glob import Glob
from .grep import Grep
from .list_directory import ListDirectory
from .read_file import ReadFile
from .read_many_files import ReadManyFiles
from .run_code import RunCode
from .shell import Shell


def builtin_tools() -> list[Tool[Any]]:
    return [Glob(), Grep(), ListDirectory(), ReadFile(), ReadManyFiles(), RunCode(), Shell()]


__all__ = ["Tool", "ToolArgs", "ToolContext", "ToolOutput", "builtin_tools"]
