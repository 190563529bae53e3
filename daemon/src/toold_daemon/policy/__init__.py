"""The policy: a pure engine (``evaluate``), shell-command reading, and load-time checks."""

from .engine import SHELL_TOOLS as SHELL_TOOLS
from .engine import Facts as Facts
from .engine import Verdict as Verdict
from .engine import evaluate as evaluate
from .engine import path_is_the_programs as path_is_the_programs
from .rules import problems as problems
from .shell import split_command as split_command

__all__ = ["SHELL_TOOLS", "Facts", "Verdict", "evaluate", "path_is_the_programs", "problems", "split_command"]
