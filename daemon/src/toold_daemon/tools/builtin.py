"""The built-in tools a daemon registers.

A module of its own, not the package's ``__init__``: the undo tool lives with the undo
code, which builds on ``tools._base``; were the package itself to import it, importing
``undo.restore`` first would find it half made.
"""

from __future__ import annotations

from typing import Any

from ..undo.restore import RestoreFiles
from ._base import Tool
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
