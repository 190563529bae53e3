"""The environment a child starts with: empty, plus an allowlist, minus secrets and injection.

Pure, so the rule can be tested without a child: ``child_environment(os.environ, ...)``.
Matching is case-insensitive: ``github_token`` is as secret as ``GITHUB_TOKEN``.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Mapping

BASE_ALLOWLIST = ("PATH", "HOME", "LANG", "LC_*", "TERM", "USER", "LOGNAME", "TZ", "SHELL")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SECRET_PATTERNS = (
    "*_KEY", "*_KEYS", "*_TOKEN", "*_TOKENS", "*_SECRET", "*_SECRETS", "*_PASSWORD", "*_PASSWD", "*_PASS",
    "*_CREDENTIALS", "*_CREDENTIAL", "*_API_KEY", "*_PRIVATE_KEY", "*_AUTH", "*_SESSION", "*_COOKIE",
    "*PASSWORD*", "*SECRET*", "*TOKEN*", "*APIKEY*",
    "AWS_*", "AZURE_*", "GOOGLE_APPLICATION_CREDENTIALS", "GCP_*", "GCLOUD_*",
    "ANTHROPIC_*", "OPENAI_*", "GEMINI_*", "MISTRAL_*", "COHERE_*", "HF_*", "HUGGING*",
    "GITHUB_*", "GH_*", "GITLAB_*", "NPM_*", "PYPI_*", "TWINE_*", "DOCKER_*", "KUBECONFIG",
    "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "*DATABASE_URL", "*_DSN", "VAULT_*", "SLACK_*", "STRIPE_*",
)  # fmt: skip

INJECTION_PATTERNS = (
    "LD_*", "DYLD_*", "BASH_ENV", "ENV", "BASH_FUNC_*", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "BASHOPTS",
    "IFS", "CDPATH", "GLOBIGNORE", "PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT",
    "PYTHONUSERBASE", "PYTHONBREAKPOINT", "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB",
    "PERLLIB", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_ASKPASS", "SSH_ASKPASS", "GIT_CONFIG_*",
    "GIT_PROXY_COMMAND", "EDITOR", "VISUAL", "PAGER", "GIT_PAGER", "MANPAGER", "BROWSER",
)  # fmt: skip


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return _globs(tuple(patterns)).match(name)


class NameGlobs:
    """Glob patterns over variable names, case-insensitive, as ``fnmatch`` reads them.

    Nearly every pattern here has one of four shapes, ``NAME``, ``PREFIX*``, ``*SUFFIX``
    and ``*INFIX*``, which string methods answer without a regular expression. Compiling
    the lists as one regex took about 2.5 ms of the daemon's start, before it could
    answer anyone; a pattern of another shape (``?``, ``[...]``, a ``*`` inside) still
    goes through ``fnmatch``'s regex."""

    def __init__(self, patterns: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: list[str] = []
        suffixes: list[str] = []
        infixes: list[str] = []
        others: list[str] = []
        for pattern in (p.upper() for p in patterns):
            core = pattern.strip("*")
            if any(c in core for c in "*?["):
                others.append(pattern)
            elif pattern.startswith("*") and pattern.endswith("*"):
                infixes.append(core)
            elif pattern.startswith("*"):
                suffixes.append(core)
            elif pattern.endswith("*"):
                prefixes.append(core)
            else:
                exact.add(pattern)
        self._exact = frozenset(exact)
        self._prefixes = tuple(prefixes)
        self._suffixes = tuple(suffixes)
        self._infixes = tuple(infixes)
        self._others = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in others)) if others else None

    def match(self, name: str) -> bool:
        upper = name.upper()
        return (
            upper in self._exact
            or upper.startswith(self._prefixes)
            or upper.endswith(self._suffixes)
            or any(infix in upper for infix in self._infixes)
            or (self._others is not None and self._others.match(upper) is not None)
        )


@functools.lru_cache(maxsize=64)
def _globs(patterns: tuple[str, ...]) -> NameGlobs:
    """A pattern list, worked out once: every call builds an environment."""
    return NameGlobs(patterns)


def is_secret(name: str) -> bool:
    """A variable that looks like it holds a credential (``*_TOKEN``, ``AWS_*`` …)."""
    return _matches(name, SECRET_PATTERNS)


def is_injection(name: str) -> bool:
    """A variable that makes a program load or run something else (``LD_PRELOAD``)."""
    return _matches(name, INJECTION_PATTERNS)


def is_dropped(name: str, extra_denied: Iterable[str] = ()) -> bool:
    """Whether a variable never reaches a child: a secret, an injection hook, or denied by config."""
    return _matches(name, SECRET_PATTERNS) or _matches(name, INJECTION_PATTERNS) or _matches(name, extra_denied)


def child_environment(
    parent: Mapping[str, str],
    *,
    allow: Iterable[str] = (),
    deny: Iterable[str] = (),
    set_vars: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Start empty; copy allowlisted names from ``parent``; add ``set_vars`` (config, the
    call's own ``env``, TMPDIR); then drop every secret or injection name, whoever set it."""
    return {**inherited_environment(parent, allow=allow, deny=deny), **acceptable(set_vars or {}, deny=deny)}


def inherited_environment(
    parent: Mapping[str, str], *, allow: Iterable[str] = (), deny: Iterable[str] = ()
) -> dict[str, str]:
    """What a child inherits from ``parent``: allowlisted names that are neither secrets
    nor injection hooks, with a default PATH. The runner computes this once at start."""
    allowed = _globs((*BASE_ALLOWLIST, *allow))
    env = acceptable({k: v for k, v in parent.items() if allowed.match(k)}, deny=deny)
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def acceptable(variables: Mapping[str, str], *, deny: Iterable[str] = ()) -> dict[str, str]:
    """``variables`` without secrets, injection hooks, names denied by config, or
    malformed names and values."""
    dropped = _globs((*SECRET_PATTERNS, *INJECTION_PATTERNS, *deny))  # one pass per variable
    return {k: v for k, v in variables.items() if not dropped.match(k) and "\0" not in k + v and "=" not in k}
