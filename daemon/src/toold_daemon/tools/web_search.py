"""web_search: search the web through the backend the administrator configured.

SearXNG and Brave are asked from the daemon itself (on a thread): the request goes only
to the administrator's URL, and the Brave key, read from the daemon's environment, never
enters a process of the client's. The ``command`` backend runs as the client, in a fresh
confined child with the network open, like any program of theirs.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

from msgspec import Meta

from toold_protocol import ToolErrorType

from ..config import Config
from ..errors import ToolError
from ._base import Tool, ToolArgs, ToolContext, ToolOutput
from ._data import WebSearchData

MAX_RESULTS = 20


class WebSearchArgs(ToolArgs, frozen=True):
    """Search the web."""

    query: Annotated[str, Meta(min_length=1, max_length=2000, description="What to search for")]
    num_results: Annotated[int, Meta(ge=1, le=MAX_RESULTS, description=f"How many results (at most {MAX_RESULTS})")] = 5


class WebSearch(Tool[WebSearchArgs]):
    name = "web_search"
    description = (
        "Search the web. Returns numbered results, each with title, URL and snippet; use web_fetch to read a result."
    )
    args_type = WebSearchArgs
    timeout_kind = "default"
    network = True  # the command backend; the HTTP backends run in the daemon (runs_in_daemon)
    data_type = WebSearchData
    output = "data: {results: [{title, url, snippet}], backend}"

    def unavailable(self, config: Config) -> str:
        if not config.tools.web_search.backend:
            return "web_search has no backend: set [tools.web_search] backend (searxng, brave or command)"
        return ""

    def runs_in_daemon(self, config: Config) -> bool:
        return config.tools.web_search.backend in ("searxng", "brave")

    def summary(self, args: WebSearchArgs) -> str:
        return f"Search the web: {args.query[:150]}"

    def run(self, args: WebSearchArgs, ctx: ToolContext) -> ToolOutput:
        from ..web import search  # the HTTP stack: imported by the first search

        settings = ctx.config.tools.web_search
        count = min(args.num_results, settings.max_results)
        timeout = max(0.5, ctx.config.tools.timeouts.default_seconds - 1.0)
        started = time.monotonic()
        try:
            if settings.backend == "searxng":
                found = search.searxng(settings.url, args.query, count, timeout)
            elif settings.backend == "brave":
                found = search.brave(settings.url, _brave_key(settings.api_key_env), args.query, count, timeout)
            elif settings.backend == "command":
                found = search.command(list(settings.command), args.query, count, timeout)
            else:
                raise ToolError(ToolErrorType.UNKNOWN_TOOL, "TOOL_NOT_CONFIGURED", self.unavailable(ctx.config))
        except search.SearchFailed as exc:
            if exc.timeout:
                elapsed = time.monotonic() - started
                raise ToolError(ToolErrorType.TIMEOUT, "TIMEOUT", f"{exc.message} ({elapsed:.1f}s)") from None
            raise ToolError(ToolErrorType.EXECUTION_FAILED, "SEARCH_FAILED", exc.message) from None
        lines = []
        for number, hit in enumerate(found, start=1):
            snippet = f"\n   {hit.snippet}" if hit.snippet else ""
            lines.append(f"{number}. {hit.title or hit.url}\n   {hit.url}{snippet}")
        content = "\n".join(lines) if lines else f"No results for {args.query[:200]!r}."
        results = [{"title": h.title, "url": h.url, "snippet": h.snippet} for h in found]
        return ToolOutput(content, data={"results": results, "backend": settings.backend})


_captured: dict[str, str] = {}


def capture_key(config: Config) -> None:
    """Keep the search key before the daemon scrubs secret-looking variables from its
    environment (so that nothing it starts can inherit them): call once, at start."""
    variable = config.tools.web_search.api_key_env
    if variable and variable in os.environ:
        _captured[variable] = os.environ[variable]


def _brave_key(variable: str) -> str:
    """The key captured at start (or still in the environment); errors name the
    variable, never a value."""
    key = _captured.get(variable) or os.environ.get(variable, "")
    if not key:
        raise ToolError(
            ToolErrorType.EXECUTION_FAILED,
            "SEARCH_FAILED",
            f"the Brave Search key is missing: the daemon's environment has no {variable}",
        )
    return key
