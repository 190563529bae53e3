"""Third-party MCP servers behind toold: their tools as ours (``gateway``)."""

from .gateway import Gateway

__all__ = ["Gateway"]
