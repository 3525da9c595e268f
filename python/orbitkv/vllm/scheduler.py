"""The connector's scheduler side, without vLLM types: hits, load and save plans.

:class:`SchedulerCore` answers "how many tokens beyond vLLM's local hits can
the Manager restore" with a metadata-only Query of the request's keys, plans
the load into the blocks vLLM allocated, plans saves of complete blocks after
each step, and decides which finished requests keep their blocks until the
workers' saves are done. It is driven by :class:`~orbitkv.vllm.connector.OrbitKVConnector`
with values taken from vLLM's objects; everything here runs on vLLM's
scheduler thread.

Bounded and exception-free: every Manager call has ``query_timeout_ms``; a
failed or slow call answers zero hits, closes the connection and skips the
Manager for ``retry_interval_s``.

Hybrid models (a model description: several KV cache groups, e.g. full
attention and a sliding window): the probes are registered with the
description and a lookup is one query of the request's chain from block 0;
its recovery plan's ``prefix_tokens`` is the hit (beyond vLLM's local hit, on
vLLM's block grid). The load plan carries every group's blocks, the worker
restores each piece into its own group; saves are per group and skip vLLM's
null blocks (sliding-window blocks outside the window). A recurrent (Mamba)
group's blocks are not positional: its saves are the exact (group, block,
boundary) states vLLM offers each step (``state_offers``), each published as
the checkpoint after ``boundary`` tokens (boundaries on the block grid only:
a plan's prefix is on every attention group's grid). The scheduler queries through "probe"
instances (one host page of the rank's slot sizes, never written: a memfd
costs no memory until touched) registered in every rank's namespace; it releases
each query at once (workers query again before they restore, so a hit that
vanished in between is a load error and vLLM recomputes it). A query the
Manager's query byte budget cut (``budget_limited``) is followed, once
released, by one for the rest of the chain: a hit is never cut at the budget.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import orbitkv
from orbitkv._chain import lookup_prefix

from .config import ConnectorConfig
from .keys import block_key
from orbitkv.hybrid import GroupKind, ModelDescription

from .layout import probe_layout
from .plan import LoadSpec, SaveSpec, StepPlan

log = logging.getLogger("orbitkv.vllm")

@dataclasses.dataclass
class _Req:
    block_hashes: Sequence[bytes]  # vLLM's list; it grows as tokens are appended
    salt: Optional[str]
    num_prompt_tokens: int
    hashes_per_block: int = 1  # vLLM may hash at a finer granularity than its blocks
    keys: List[bytes] = dataclasses.field(default_factory=list)
    block_ids: List[List[int]] = dataclasses.field(default_factory=list)  # per KV cache group
    saved: int = 0  # blocks [0, saved) are stored, loaded, or their save is issued
    hit: Tuple[int, int, List[str]] = (0, 0, [])  # (local blocks, Manager hits, tiers) of the last query
    load: Optional[LoadSpec] = None  # the async load in flight (until finished_recving)
    last_load: Optional[LoadSpec] = None  # the latest load, for its load errors
    saves_issued: bool = False
    no_loads: bool = False  # a hybrid load of it failed: no more Manager hits
    state_floor: int = 0  # recurrent checkpoints at or below this many tokens are stored or loaded

    def sync_keys(self) -> List[bytes]:
        """One key per complete block: the hash at the block's last token."""
        r = self.hashes_per_block
        for i in range(len(self.keys), len(self.block_hashes) // r):
            self.keys.append(block_key(self.block_hashes[(i + 1) * r - 1], self.salt))
        return self.keys


class SchedulerStats:
    FIELDS = (
        "queries",
        "query_failures",
        "hit_blocks_dram",
        "hit_blocks_ssd",
        "missed_blocks",
        "load_blocks_planned",
        "save_blocks_planned",
        "recompute_blocks",
    )

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0)


class SchedulerCore:
    def __init__(
        self,
        config: ConnectorConfig,
        probes: Sequence[Tuple[str, Sequence[int]]],
        block_size: int,
        client_factory: Optional[Callable[[], "orbitkv.Client"]] = None,
        hash_block_size: Optional[int] = None,
        description: Optional[ModelDescription] = None,
    ) -> None:
        """probes: (namespace, slot sizes) per rank; hybrid (`description`
        set): (namespace, slot sizes per storage group) per rank."""
        if not probes:
            raise ValueError("SchedulerCore: no namespaces")
        hash_block_size = hash_block_size or block_size
        if block_size % hash_block_size:
            raise ValueError(
                f"block size {block_size} is not a multiple of the hash block size {hash_block_size}"
            )
        self.hashes_per_block = block_size // hash_block_size
        self.cfg = config
        self.namespaces = [ns for ns, _ in probes]
        self.description = description
        self._recurrent = {g.storage_group for g in (description.groups if description else ())
                           if g.kind == GroupKind.RECURRENT}
        self.null_block = 0  # vLLM's null block (BlockPool.null_block); set by the connector
        # The Manager wants every instance of a namespace to have its slot sizes.
        if description is not None:
            self._probe_layouts = [probe_layout(b) for _, b in probes]
        else:
            self._probe_layouts = [orbitkv.page_first_layout(1, list(b)) for _, b in probes]
        self.block_size = block_size
        self._client_factory = client_factory or (
            lambda: orbitkv.Client(
                config.resolved_socket_path(),
                timeout_ms=config.query_timeout_ms,
                client_name="vllm-scheduler",
            )
        )
        self._client: Optional[orbitkv.Client] = None
        self._probes: List[int] = []
        self._probe_pages: List[orbitkv.HostPages] = []
        self._next_retry = 0.0
        self._reqs: Dict[str, _Req] = {}
        self._pending_loads: List[LoadSpec] = []
        self._delayed: List[str] = []
        self._stats = SchedulerStats()

    # ---- the Manager -------------------------------------------------------

    def _session(self) -> Optional["orbitkv.Client"]:
        if self._client is not None:
            return self._client
        if time.monotonic() < self._next_retry:
            return None
        client = None
        try:
            client = self._client_factory()
            pages = [
                orbitkv.HostPages(lay.region_bytes[0], "orbitkv-vllm-probe")
                for lay in self._probe_layouts
            ]
            model = self.description
            probes = [
                client.register_instance(ns, 0, "host", lay, [p], model=model)
                if model is not None else client.register_instance(ns, 0, "host", lay, [p])
                for ns, lay, p in zip(self.namespaces, self._probe_layouts, pages)
            ]
        except (orbitkv.OrbitKVError, OSError) as e:
            if client is not None:
                client.close()
            self._fail(f"connect to {self.cfg.resolved_socket_path()}: {e}")
            return None
        self._client, self._probes, self._probe_pages = client, probes, pages
        return client

    def _fail(self, what: str) -> None:
        self._stats.values["query_failures"] += 1
        log.warning("OrbitKV: %s; no Manager lookups for %.1f s", what, self.cfg.retry_interval_s)
        self.close()
        self._next_retry = time.monotonic() + self.cfg.retry_interval_s

    def query(self, keys: List[bytes]) -> Tuple[int, List[str]]:
        """(blocks every rank can restore, tiers of rank 0's blocks); (0, []) on any failure.

        A lookup cut by the Manager's query byte budget is released and followed
        by one for the rest of the chain (orbitkv._chain.lookup_prefix), so a
        prefix larger than the budget is a whole hit. Every call has
        query_timeout_ms; no follow-up starts after query_timeout_ms from the
        first (the hit is then what was seen by then)."""
        client = self._session()
        if client is None or not keys:
            return 0, []
        self._stats.values["queries"] += 1
        if self.description is not None:
            return self._query_plan(client, keys)
        deadline = time.monotonic() + self.cfg.query_timeout_ms / 1000.0
        ttl = self.cfg.query_timeout_ms
        prefix, tiers = len(keys), []
        try:
            for i, inst in enumerate(self._probes):
                walk = lookup_prefix(
                    keys[:prefix],
                    lambda rest, inst=inst: client.query(inst, 0, rest, ttl_ms=ttl),
                    lambda query, inst=inst: client.release_query(inst, query),
                    deadline=deadline,
                )
                if i == 0:
                    tiers = walk.sources
                prefix = min(prefix, walk.blocks)
                if prefix == 0:
                    break
        except (orbitkv.OrbitKVError, OSError) as e:
            self._fail(f"query: {e}")
            return 0, []
        return prefix, tiers[:prefix]

    def _query_plan(self, client: "orbitkv.Client", keys: List[bytes]) -> Tuple[int, List[str]]:
        """Hybrid: (blocks of the recovery plan's prefix every rank can restore,
        the tier of each of those blocks). `keys` start at block 0."""
        ttl = self.cfg.query_timeout_ms
        blocks, tiers = len(keys), []
        try:
            for i, inst in enumerate(self._probes):
                q = client.query(inst, 0, keys[:blocks], ttl_ms=ttl)
                try:
                    blocks = min(blocks, q.prefix_tokens // self.block_size)
                    if i == 0:
                        tiers = _block_tiers(self.description, q.pieces, blocks)
                finally:
                    if q.prefix:  # a query without pieces holds nothing (and is not live)
                        client.release_query(inst, q.query)
                if blocks == 0:
                    break
        except (orbitkv.OrbitKVError, OSError) as e:
            self._fail(f"query: {e}")
            return 0, []
        return blocks, tiers[:blocks]

    # ---- vLLM's scheduler hooks ----------------------------------------------

    def num_new_matched_blocks(
        self,
        req_id: str,
        block_hashes: Sequence[bytes],
        salt: Optional[str],
        num_prompt_tokens: int,
        num_tokens: int,
        num_computed_tokens: int,
    ) -> int:
        """Blocks beyond `num_computed_tokens` (block aligned) the Manager can restore."""
        st = self._reqs.get(req_id)
        if st is None:
            st = self._reqs[req_id] = _Req(
                block_hashes, salt, num_prompt_tokens, hashes_per_block=self.hashes_per_block
            )
        local = num_computed_tokens // self.block_size
        st.saved = max(st.saved, local)
        if self.cfg.load_policy == "off" or st.no_loads:
            return 0
        keys = st.sync_keys()
        # vLLM computes at least the last token itself.
        limit = min(len(keys), (num_tokens - 1) // self.block_size)
        if limit <= local:
            return 0
        if self.description is not None:
            # The plan of a prefix needs the chain from its start (window
            # blocks and states before vLLM's local hit).
            prefix, tiers = self.query(keys[:limit])
            hits, tiers = max(0, prefix - local), tiers[local:]
        else:
            hits, tiers = self.query(keys[local:limit])
        self._stats.values["missed_blocks"] += (limit - local) - hits
        if hits < self.cfg.min_hit_blocks:
            hits, tiers = 0, []
        st.hit = (local, hits, tiers)
        # Blocks the Manager holds need no save.
        st.saved = max(st.saved, local + hits)
        return hits

    def hit_tiers(self, req_id: str, num_blocks: int) -> Dict[str, int]:
        """Blocks per tier ('dram', 'ssd') of the last query's first `num_blocks` hits."""
        st = self._reqs.get(req_id)
        if st is None:
            return {}
        return dict(collections.Counter(st.hit[2][:num_blocks]))

    def after_alloc(self, req_id: str, block_ids: Sequence[Sequence[int]],
                    num_external_tokens: int) -> None:
        """vLLM allocated `block_ids` (every block of the request, per KV cache
        group) and will take `num_external_tokens` from us."""
        st = self._reqs.get(req_id)
        if st is None or num_external_tokens <= 0:
            return
        local, hits, tiers = st.hit
        n = num_external_tokens // self.block_size
        if n > hits:  # never offered; load what was, vLLM recomputes the rest
            log.warning("OrbitKV: vLLM took %d external blocks of %s, %d were offered", n, req_id, hits)
            n = hits
        if self.description is not None:
            # The checkpoint the load brings is the Manager's: vLLM offers it again, no save.
            st.state_floor = max(st.state_floor, (local + n) * self.block_size)
            spec = LoadSpec(req_id, st.keys[: local + n], [],
                            group_block_ids=[list(g) for g in block_ids],
                            skip_blocks=local, prefix_tokens=(local + n) * self.block_size,
                            null_block=self.null_block)
        else:
            spec = LoadSpec(req_id, st.keys[local : local + n], list(block_ids[0][local : local + n]))
        st.load = st.last_load = spec
        self._pending_loads.append(spec)
        for t in tiers[:n]:
            self._stats.values["hit_blocks_" + t] += 1
        self._stats.values["load_blocks_planned"] += n

    def build_plan(
        self,
        new_reqs: Sequence[Tuple[str, Sequence[int], int]],
        cached_reqs: Sequence[Tuple[str, Optional[Sequence[int]], bool, int]],
        num_scheduled_tokens: Dict[str, int],
        num_spec_tokens: Dict[str, int],
        preempted: Set[str],
        state_offers: Optional[Dict[str, Sequence[Tuple[int, int, int]]]] = None,
    ) -> StepPlan:
        """The step's plan. new_reqs: (req_id, block_ids, num_computed_tokens);
        cached_reqs: (req_id, new_block_ids or None, resumed, num_computed_tokens);
        block ids are per KV cache group (vLLM's tuple of lists). state_offers:
        req_id -> [(group, block id, boundary tokens)], the recurrent states
        this step's forward leaves in those blocks (vLLM's
        boundary_state_offloads)."""
        plan = StepPlan(sync_load=self.cfg.load_policy == "sync")
        plan.loads, self._pending_loads = self._pending_loads, []
        if self.cfg.load_policy == "sync":
            for spec in plan.loads:
                self._reqs[spec.req_id].load = None  # done within this step
        plan.delayed_free, self._delayed = self._delayed, []
        plan.preempted = sorted(preempted)
        scheduled: List[Tuple[_Req, str, int]] = []
        for req_id, block_ids, computed in new_reqs:
            st = self._reqs.get(req_id)
            if st is not None:
                st.block_ids = [list(g) for g in block_ids]
                scheduled.append((st, req_id, computed))
        for req_id, new_ids, resumed, computed in cached_reqs:
            st = self._reqs.get(req_id)
            if st is None:
                continue
            if resumed:
                st.block_ids = [list(g) for g in new_ids or ()]
            elif new_ids:
                if not st.block_ids:
                    st.block_ids = [[] for _ in new_ids]
                for have, new in zip(st.block_ids, new_ids):
                    have.extend(new)
            scheduled.append((st, req_id, computed))
        if self.cfg.save_policy == "off":
            return plan
        self._plan_state_saves(plan, state_offers or {})
        for st, req_id, computed in scheduled:
            if st.load is not None:
                continue  # its blocks are being written by the Manager
            done = computed + num_scheduled_tokens.get(req_id, 0) - num_spec_tokens.get(req_id, 0)
            end = min([done // self.block_size, len(st.sync_keys())]
                      + [len(g) for g in st.block_ids])
            if self.cfg.save_policy == "prompt":
                end = min(end, st.num_prompt_tokens // self.block_size)
            if end > st.saved:
                for g, ids in enumerate(st.block_ids):
                    if g in self._recurrent:
                        continue  # not positional: saved from state_offers
                    # A null block left the window (or was never computed here).
                    blocks = [b for b in range(st.saved, end) if ids[b] != self.null_block]
                    if blocks:
                        plan.saves.append(SaveSpec(req_id, [st.keys[b] for b in blocks],
                                                   [ids[b] for b in blocks], group=g))
                        self._stats.values["save_blocks_planned"] += len(blocks)
                        st.saves_issued = True
                st.saved = end
        return plan

    def _plan_state_saves(self, plan: StepPlan,
                          offers: Dict[str, Sequence[Tuple[int, int, int]]]) -> None:
        """Saves of the recurrent states vLLM offers: one checkpoint each, under
        the chain key of the prefix that ends at its boundary."""
        for req_id, states in offers.items():
            st = self._reqs.get(req_id)
            if st is None or st.load is not None:
                continue  # unknown, or its blocks are being written by a load
            keys = st.sync_keys()
            for group, block, boundary in sorted(states, key=lambda s: s[2]):
                if group not in self._recurrent or boundary % self.block_size:
                    continue  # off the block grid: no plan's prefix ends there
                if boundary <= st.state_floor or boundary // self.block_size > len(keys):
                    continue  # stored or loaded already, or no key for it yet
                if self.cfg.save_policy == "prompt" and boundary > st.num_prompt_tokens:
                    continue
                plan.saves.append(SaveSpec(req_id, [keys[boundary // self.block_size - 1]],
                                           [block], group=group))
                self._stats.values["save_blocks_planned"] += 1
                st.state_floor = boundary
                st.saves_issued = True

    def on_output(self, finished_recving: Set[str], invalid_block_ids: Set[int],
                  failed_recving: Set[str] = frozenset()) -> None:
        """Worker results of a step: finished loads, blocks whose load failed,
        and (hybrid) loads that failed as a whole (vLLM recomputes the request)."""
        for req_id in failed_recving:
            st = self._reqs.get(req_id)
            if st is not None and st.last_load is not None:
                st.saved = min(st.saved, st.hit[0])
                st.state_floor = min(st.state_floor, st.hit[0] * self.block_size)
                st.no_loads = True  # its retry computes; a broken load is not retried
                self._stats.values["recompute_blocks"] += st.hit[1]
        for st in self._reqs.values():
            spec = st.last_load
            if spec is None or not invalid_block_ids:
                continue
            bad = [i for i, b in enumerate(spec.block_ids) if b in invalid_block_ids]
            if bad:
                # vLLM recomputes from the first failed block: save from there.
                local = st.hit[0]
                st.saved = min(st.saved, local + bad[0])
                self._stats.values["recompute_blocks"] += len(spec.block_ids) - bad[0]
        for req_id in finished_recving:
            st = self._reqs.get(req_id)
            if st is not None:
                st.load = None

    def request_finished(self, req_id: str) -> bool:
        """True if vLLM must keep the request's blocks until a worker reports it
        in finished_sending (saves of its blocks were issued)."""
        st = self._reqs.pop(req_id, None)
        if st is None:
            return False
        if st.load is not None:
            return False  # vLLM keeps blocks of a loading request until finished_recving
        if st.saves_issued:
            self._delayed.append(req_id)
            return True
        return False

    def take_stats(self) -> Dict[str, int]:
        stats, self._stats = self._stats, SchedulerStats()
        return stats.values

    def tracked(self) -> int:
        return len(self._reqs)

    def close(self) -> None:
        """Closes the connection (the Manager drops the probe instances)."""
        if self._client is not None:
            self._client.close()
        self._client, self._probes = None, []
        for p in self._probe_pages:
            p.close()
        self._probe_pages = []


def _block_tiers(d: ModelDescription, pieces, blocks: int) -> List[str]:
    """The tier of each of the first `blocks` blocks of a recovery plan: that
    of the first full-attention group's block (the deepest tier of the plan
    for models without one)."""
    full = [g.storage_group for g in d.groups if g.kind == GroupKind.FULL_ATTENTION]
    if full:
        by_block = {p.index: p.tier for p in pieces if p.storage_group == full[0]}
        return [by_block.get(b, "dram") for b in range(blocks)]
    tier = "ssd" if any(p.tier == "ssd" for p in pieces) else "dram"
    return [tier] * blocks

