"""Built-in tools, one module each. ``builtin_tools`` lists what a daemon registers."""

from __future__ import annotations

from typing import Any

from ..undo.restore import RestoreFiles
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from .apply_patch import ApplyPatch
from .delete_file import DeleteFile
from .edit_file import EditFile
from .glob import Glob
from .grep import Grep
from .list_directory import ListDirectory
from .memory import Memory
from .move_file import MoveFile
from .read_file import ReadFile
from .read_many_files import ReadManyFiles
from .run_code import RunCode
from .shell import Shell
from .shell_jobs import ShellJobs
from .web_fetch import WebFetch
from .web_search import WebSearch
from .write_file import WriteFile
from .write_todos import WriteTodos


def builtin_tools() -> list[Tool[Any]]:
    return [
        ApplyPatch(),
        DeleteFile(),
        EditFile(),
        Glob(),
        Grep(),
        ListDirectory(),
        Memory(),
        MoveFile(),
        ReadFile(),
        ReadManyFiles(),
        RestoreFiles(),
        RunCode(),
        Shell(),
        ShellJobs(),
        WebFetch(),
        WebSearch(),
        WriteFile(),
        WriteTodos(),
    ]


__all__ = ["Tool", "ToolArgs", "ToolContext", "ToolOutput", "builtin_tools"]
