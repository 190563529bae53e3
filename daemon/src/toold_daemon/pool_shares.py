"""How much of a pool shared by every user one uid may hold at once.

Tool workers and MCP server instances are bounded pools: a call that finds none free
waits, or is refused. Without a bound per uid, one user whose calls are slow (on purpose
or not) could hold them all and leave every other user's calls waiting. By default a uid
may hold all of a pool but a quarter of it, and at least one place is left for others.
"""

from __future__ import annotations


def per_uid_share(pool: int, configured: int) -> int:
    """Places of ``pool`` one uid may hold: ``configured`` (at most the pool), or by
    default (0) all but a quarter of the pool, one kept for the others at the least
    (a pool of one is all one uid's)."""
    if configured:
        return min(configured, pool)
    return max(1, pool - max(1, pool // 4))
