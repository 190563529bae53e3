"""toold daemon: executes LLM tool calls for local clients under one policy."""

__version__ = "0.1.0"

__all__ = ["__version__"]
