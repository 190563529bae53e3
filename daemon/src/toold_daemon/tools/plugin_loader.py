"""Finding and loading plugin tools (entry-point group ``toold.tools``).

Each entry point must name a ``Tool`` subclass with a name no other tool has and an
argument struct msgspec can turn into a JSON Schema. One that fails to import or to
qualify is reported with the reason and skipped: a broken plugin never stops the
daemon. Plugins are loaded in the daemon before the spawner forks, so the spawner and
every worker hold the same code; they never run in the daemon itself.

``importlib.metadata`` takes 25-50 ms to import here, a tenth of the daemon's start, for
a group nearly every installation leaves empty: it is imported only when an installed
distribution's ``entry_points.txt`` names the group (``_group_declared``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from ..config import DaemonConfig
from ._base import Tool
from .registry import parameters_schema

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = "toold.tools"
log = logging.getLogger(__name__)


class PluginReport(msgspec.Struct, frozen=True):
    entry_point: str
    distribution: str
    version: str
    tool: str  # the tool's name ("" when it did not load)
    loaded: bool
    reason: str = ""  # why it was skipped

    def line(self) -> str:
        source = f"{self.distribution} {self.version}".strip() or "?"
        if self.loaded:
            return f"{self.entry_point}: tool {self.tool} from {source}"
        return f"{self.entry_point}: skipped ({self.reason}) from {source}"


def load_plugins(daemon: DaemonConfig, taken: set[str]) -> tuple[list[Tool[Any]], list[PluginReport]]:
    """The plugin tools to register, and a report line for every entry point seen.
    ``taken``: names (and aliases) of the tools already there."""
    tools: list[Tool[Any]] = []
    reports: list[PluginReport] = []
    if not _group_declared(GROUP):
        return tools, reports
    from importlib.metadata import entry_points

    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        report = _reporter(point)
        if daemon.plugins is not None and point.name not in daemon.plugins:
            reports.append(report("", False, "not in [daemon] plugins"))
            continue
        if point.name in daemon.disabled_plugins:
            reports.append(report("", False, "in [daemon] disabled_plugins"))
            continue
        try:
            tool = _load(point, taken)
        except Exception as exc:  # anything a plugin's import can raise
            reason = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("plugin %s skipped: %s", point.name, reason)
            reports.append(report("", False, reason))
            continue
        taken.update({tool.name, *tool.aliases})
        tools.append(tool)
        reports.append(report(tool.name, True))
        log.info("plugin %s", reports[-1].line())
    return tools, reports


def _group_declared(group: str, path: list[str] | None = None) -> bool:
    """Whether an entry point of ``group`` may be installed: some distribution on the
    import path (``sys.path``) names it in its ``entry_points.txt``. Errs towards yes: a
    path entry that is not a directory (a zip) or cannot be listed says yes, and
    ``importlib.metadata`` then decides."""
    header = f"[{group}]"
    for entry in sys.path if path is None else path:
        directory = entry or "."
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue  # nothing there, nothing to import from
        except OSError:
            return True  # a zip, or a directory we may not list
        for name in names:
            if not name.lower().endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(directory, name, "entry_points.txt"), encoding="utf-8", errors="replace") as f:
                    if header in f.read():
                        return True
            except (FileNotFoundError, NotADirectoryError):
                continue  # no entry points (an .egg-info may be a file of its own)
            except OSError:
                return True
    return False


def _reporter(point: EntryPoint) -> Callable[..., PluginReport]:
    distribution = point.dist.name if point.dist is not None else ""
    version = point.dist.version if point.dist is not None else ""

    def report(tool: str, loaded: bool, reason: str = "") -> PluginReport:
        return PluginReport(point.name, distribution, version, tool, loaded, reason)

    return report


def _load(point: EntryPoint, taken: set[str]) -> Tool[Any]:
    target = point.load()
    if not (isinstance(target, type) and issubclass(target, Tool)):
        raise TypeError(f"{point.value} is not a toold Tool subclass")
    tool = target()
    name = getattr(tool, "name", "")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{point.value} has no name")
    clash = {name, *tool.aliases} & taken
    if clash:
        raise ValueError(f"the name {sorted(clash)[0]!r} is already taken")
    args_type = getattr(tool, "args_type", None)
    if not (isinstance(args_type, type) and issubclass(args_type, msgspec.Struct)):
        raise TypeError("args_type must be a ToolArgs (msgspec.Struct) subclass")
    schema = parameters_schema(args_type)
    if schema.get("type") != "object":
        raise TypeError("its arguments' schema is not an object schema")
    if not isinstance(getattr(tool, "description", None), str):
        raise TypeError("description must be a string")
    return tool
