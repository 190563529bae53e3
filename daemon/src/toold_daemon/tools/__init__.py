"""Built-in tools, one module each (``builtin`` lists what a daemon registers), and
what every tool is made of (``_base``)."""

from __future__ import annotations

from ._base import Tool, ToolArgs, ToolContext, ToolOutput

__all__ = ["Tool", "ToolArgs", "ToolContext", "ToolOutput"]
