"""Filesystem confinement: path validation and symlink-safe opening."""

from .paths import Sandbox as Sandbox

__all__ = ["Sandbox"]
