"""What a plugin needs to write a tool, and nothing else: the public API for plugins.

A distribution registers its tools under the entry-point group ``toold.tools``, each
entry point naming a ``Tool`` subclass::

    [project.entry-points."toold.tools"]
    shout = "toold_shout:Shout"

The daemon loads them at start (``[daemon] plugins`` / ``disabled_plugins`` choose),
and they get what built-in tools get: schema export, validation, policy,
confirmations, journal, truncation and isolation (they run in a confined worker or
child as the requesting user, never in the daemon). See README, "Plugins".
"""

from __future__ import annotations

from toold_protocol import ToolErrorType

from .errors import ToolError
from .tools._base import Command, Tool, ToolArgs, ToolContext, ToolOutput

__all__ = ["Command", "Tool", "ToolArgs", "ToolContext", "ToolError", "ToolErrorType", "ToolOutput"]
