"""Filesystem confinement: path validation and symlink-safe opening."""

from __future__ import annotations

from pathlib import Path

from ..config import DEFAULT_DENIED_PATTERNS, DEFAULT_PROTECTED_PATTERNS, Config
from .paths import Sandbox as Sandbox


def build_sandbox(config: Config, roots: list[Path], *, verified: bool = True) -> Sandbox:
    """The sandbox a configuration describes (``roots`` from the command line win).
    ``verified`` false: ``roots`` are canonical already (see ``Sandbox``)."""
    sandbox_config = config.tools.sandbox
    chosen = roots or [Path(r) for r in sandbox_config.allowed_roots] or [Path.cwd()]
    denied = list(sandbox_config.denied_patterns)
    if sandbox_config.include_default_denies:
        denied = [*DEFAULT_DENIED_PATTERNS, *denied]
    protected = list(sandbox_config.protected_patterns)
    if sandbox_config.include_default_protected:
        protected = [*DEFAULT_PROTECTED_PATTERNS, *protected]
    return Sandbox(
        chosen,
        denied_patterns=denied,
        protected_patterns=protected,
        allow_absolute=sandbox_config.allow_absolute,
        verified=verified,
    )


__all__ = ["Sandbox", "build_sandbox"]
