"""A key chain's cached prefix past the Manager's query byte budget.

The Manager charges every query's logical object bytes, SSD-resident blocks
included, to a byte budget (by default the DRAM pool less its read staging;
each session with instances gets a share of it) and cuts a chain it cannot
charge: ``QueryResult.prefix`` is then shorter than what is cached and
``budget_limited`` is True. The charge goes when the query's blocks are
restored or the query is released, so the rest of the chain can be asked for
then. Every adapter (``orbitkv.transformers``, ``orbitkv.vllm``,
``orbitkv.sglang``) walks a chain through :func:`take_prefix` (restores) or
:func:`lookup_prefix` (metadata-only lookups) instead of taking a cut prefix
for the hit length. Pure Python, no torch; the caller's thread runs the calls.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, List, Optional, Sequence

__all__ = ["PrefixWalk", "lookup_prefix", "take_prefix"]


@dataclasses.dataclass
class PrefixWalk:
    """What :func:`take_prefix` did: `blocks` taken from the chain's start,
    `queries` made, `sources` (each taken block's tier, in order; filled by
    lookup_prefix). `continuations`: the queries that followed a budget cut."""

    blocks: int = 0
    queries: int = 0
    sources: List[str] = dataclasses.field(default_factory=list)

    @property
    def continuations(self) -> int:
        return max(0, self.queries - 1)


def take_prefix(
    keys: Sequence[bytes],
    query: Callable[[Sequence[bytes]], object],
    take: Callable[[object, int], int],
    *,
    deadline: Optional[float] = None,
    walk: Optional[PrefixWalk] = None,
) -> PrefixWalk:
    """Takes the longest cached prefix of `keys`, one query at a time.

    ``query(rest)`` queries ``rest = keys[done:]`` and returns its QueryResult
    ``q``; ``take(q, done)`` uses the q.prefix blocks that start at
    ``keys[done]`` (restores them, or only notes them) and returns how many it
    took. REQUIRES: take ends all of q's leases before it returns or raises
    (restore every block or release the query), since the budget comes back
    only then. Fewer than q.prefix (a failed restore) stops the walk, as do a
    query with prefix 0 and one that was not budget_limited; a budget_limited
    one is followed by a query for the rest. ``deadline`` (time.monotonic()):
    no follow-up query is started after it (the walk answers what it took).
    Exceptions of query and take propagate; pass `walk` to keep what was taken
    before one (it is updated in place and returned)."""
    walk = walk if walk is not None else PrefixWalk()
    while walk.blocks < len(keys):
        if walk.queries and deadline is not None and time.monotonic() >= deadline:
            break
        q = query(keys[walk.blocks :])
        walk.queries += 1
        if q.prefix == 0:
            break
        n = take(q, walk.blocks)
        walk.blocks += n
        if n < q.prefix or not q.budget_limited:
            break
    return walk


def lookup_prefix(
    keys: Sequence[bytes],
    query: Callable[[Sequence[bytes]], object],
    release: Callable[[int], None],
    *,
    deadline: Optional[float] = None,
) -> PrefixWalk:
    """The longest cached prefix of `keys` and its blocks' tiers, metadata only:
    each query is released (``release(q.query)``) before the next one is made.
    See take_prefix for `query`, `deadline` and when the walk stops."""

    def note(q, done: int) -> int:
        release(q.query)
        walk.sources.extend(q.sources)
        return q.prefix

    walk = PrefixWalk()
    return take_prefix(keys, query, note, deadline=deadline, walk=walk)
