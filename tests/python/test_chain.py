"""orbitkv._chain against a real Manager: a chain larger than the query byte
budget is walked whole, each cut query released before the next; and the
walk's stop conditions (a failed take, a deadline)."""

from __future__ import annotations

import hashlib
import time

import orbitkv
from orbitkv._chain import lookup_prefix, take_prefix

SLOT = 64 << 10  # one 64 KiB slot per page


def _setup(client, pages: int):
    layout = orbitkv.page_first_layout(pages, [SLOT])
    regions = orbitkv.allocate_regions(layout)
    inst = client.register_instance("chain-test", 0, "host", layout, regions)
    return inst, regions


def _keys(n: int):
    return [hashlib.sha256(b"chain%d" % i).digest() for i in range(n)]


def test_prefix_larger_than_query_budget_is_looked_up_and_taken_whole(start_manager):
    m = start_manager("1mib")  # budget 768 KiB; with SSD, so 32 objects of 64 KiB all stay
    n = 32
    keys = _keys(n)
    with m.client() as c:
        inst, regions = _setup(c, n)
        view = regions[0].numpy()
        for p in range(n):
            view[p * SLOT : (p + 1) * SLOT] = p
        assert c.publish(inst, 0, keys, list(range(n))).stored == n
        view[:] = 255
        query = lambda rest: c.query(inst, 0, rest, 5000)  # noqa: E731
        first = query(keys)
        c.release_query(inst, first.query)
        assert first.budget_limited and 0 < first.prefix < n, first

        walk = lookup_prefix(keys, query, lambda q: c.release_query(inst, q))
        assert walk.blocks == n and len(walk.sources) == n and walk.continuations >= 1

        def restore(q, base):
            res = c.restore(inst, q.query, list(range(q.prefix)), list(range(base, base + q.prefix)))
            assert all(r.ok for r in res), [r.error for r in res if not r.ok]
            return q.prefix

        walk = take_prefix(keys, query, restore)
        assert walk.blocks == n and walk.queries == walk.continuations + 1 >= 2
        for p in range(n):
            assert (view[p * SLOT : (p + 1) * SLOT] == p).all(), p

        # A take that stops short ends the walk there (a failed restore).
        def short(q, base):
            c.release_query(inst, q.query)
            return q.prefix - 1

        walk = take_prefix(keys, query, short)
        assert walk.queries == 1 and walk.blocks == first.prefix - 1
        # Past the deadline no follow-up starts: the first query's blocks only.
        walk = lookup_prefix(keys, query, lambda q: c.release_query(inst, q),
                             deadline=time.monotonic() - 1)
        assert walk.queries == 1 and walk.blocks == first.prefix
        # Every lease went: a whole-chain query is cut at the same place again.
        again = query(keys)
        c.release_query(inst, again.query)
        assert again.prefix == first.prefix
