"""Filesystem confinement: path validation and symlink-safe opening."""

from __future__ import annotations

from pathlib import Path

from ..config import DEFAULT_DENIED_PATTERNS, DEFAULT_PROTECTED_PATTERNS, Config
from .homes import HOME_DOTFILES
from .paths import Sandbox as Sandbox


def protected_patterns(config: Config) -> list[str]:
    """The built-in protected patterns (less those the configuration drops) and its own."""
    sandbox_config = config.tools.sandbox
    built_in = DEFAULT_PROTECTED_PATTERNS if sandbox_config.include_default_protected else ()
    dropped = set(sandbox_config.unprotected_patterns)
    return [*(p for p in built_in if p not in dropped), *sandbox_config.protected_patterns]


def protects_homes(config: Config) -> bool:
    """Whether every home directory's dot-entries are protected (``~/.*``)."""
    sandbox_config = config.tools.sandbox
    return sandbox_config.include_default_protected and HOME_DOTFILES not in sandbox_config.unprotected_patterns


def build_sandbox(config: Config, roots: list[Path], *, verified: bool = True) -> Sandbox:
    """The sandbox a configuration describes (``roots`` from the command line win).
    ``verified`` false: ``roots`` are canonical already (see ``Sandbox``)."""
    sandbox_config = config.tools.sandbox
    chosen = roots or [Path(r) for r in sandbox_config.allowed_roots] or [Path.cwd()]
    denied = list(sandbox_config.denied_patterns)
    if sandbox_config.include_default_denies:
        denied = [*DEFAULT_DENIED_PATTERNS, *denied]
    return Sandbox(
        chosen,
        denied_patterns=denied,
        protected_patterns=protected_patterns(config),
        protect_homes=protects_homes(config),
        allow_absolute=sandbox_config.allow_absolute,
        verified=verified,
    )


__all__ = ["Sandbox", "build_sandbox", "protected_patterns", "protects_homes"]
