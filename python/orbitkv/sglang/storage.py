"""OrbitKVStorage: SGLang's HiCacheStorage on an OrbitKV Manager.

Contract
--------
* Built by SGLang's dynamic backend factory as ``OrbitKVStorage(storage_config,
  kwargs)``; it connects to the Manager at once (a Manager that is not there
  fails the attach with the reason). Each host pool SGLang registers
  (``register_mem_pool_host`` for the KV pool, ``register_mem_host_pool_v2``
  for the hybrid ``swa`` / ``mamba`` / ... pools) becomes one OrbitKV host
  instance with one storage group, registered when the pool set is complete
  (``on_host_pools_registered``, or the first call). A KV pool alone, or with
  v2 pools of which one has no model mapping, is dense: each instance in the
  pool's own namespace. A KV pool with v2 pools that all map (kv / indexer:
  full attention; mamba: a checkpoint after every page; a pool named in
  ``window_pages``: a sliding window) is a hybrid set: every instance carries
  the same :class:`orbitkv.hybrid.ModelDescription` in one namespace and holds
  its own storage group; the Manager's recovery plan answers lookups for all
  pools at once (``batch_exists_v2``) and each pool restores its pieces.
* Stored bytes are the pool's flat data page (``get_data_page`` /
  ``set_from_flat_data_page``, the format SGLang's own backends store), one
  object per (namespace, page hash). Keys: :func:`page_key`.
* Every method raises on a failure (the Manager gone, a bad argument, a pool
  that was never registered) and never returns None for one; SGLang logs the
  exception and goes on. A miss is not a failure: ``batch_exists`` counts it,
  ``batch_get_v1`` reports False from the first missing page on, ``get``
  returns None (SGLang's contract for a missing key).
* ``clear()`` drops every object of its pools' namespaces from the Manager, in
  DRAM and on SSD (``Client.clear_namespace``); other engines' and other TP
  ranks' namespaces keep theirs.
* Thread-safe: SGLang's prefetch and backup threads call it at once.

Memory: one bounded copy, not zero copy
---------------------------------------
The Manager reads and writes engine host memory only through memfds sealed
against shrinking (F_SEAL_SHRINK, passed by SCM_RIGHTS), so that an engine
cannot truncate memory under it. SGLang allocates its host pool itself: by
default an anonymous MAP_SHARED mapping (no fd at all), or with
``"allocator": "shm"`` a memfd created without MFD_ALLOW_SEALING, which the
kernel refuses to seal (F_ADD_SEALS fails with EPERM; the tests check this on
SGLang's own allocator). Neither can be registered, so each pool gets a staging
region of ``staging_bytes`` (an :class:`orbitkv.HostPages`, registered as the
instance's only region) and pages are copied pool <-> staging with one torch
copy per page; the Manager copies staging <-> its DRAM pool as for any host
engine. Calls larger than the staging area go through it in chunks; concurrent
calls share its pages.

Namespaces (:func:`pool_namespace`)
-----------------------------------
``<prefix>|<model>|pool=<name>|<format>|<shard>``: the format names the pool
class, its layout (``layer_first``, ``page_first``, ``page_first_direct``,
...), dtype, tokens per page, bytes per page and the pool's
``storage_format_tag``; the shard is ``tp=<rank>/<size>`` for TP-sharded state
(every non-MLA pool, and Mamba state always) or ``tp=mla-replicated`` for MLA
KV (one copy shared by all TP ranks, written by SGLang's storage writer rank),
plus ``pp=``, ``cp=`` and ``dcp=`` parts when those are used. TP ranks, layouts
and models never share an object.

Extra-config keys (``--hicache-storage-backend-extra-config``)
------------------------------------------------------------
``backend_name``, ``module_path``, ``class_name``: SGLang's, as in the module
docstring. ``interface_v1``: 1 makes SGLang use ``batch_get_v1`` /
``batch_set_v1`` (recommended; 0 uses the single-key methods, same bytes).
``socket``: the Manager socket (default ``$ORBITKV_SOCKET`` or
:func:`orbitkv.default_socket_path`). ``namespace``: the namespace prefix
(default ``sglang``; change it to start from an empty cache, e.g. after a
weight update under the same model name). ``staging_bytes``: staging per pool
(default 256 MiB, at least one page). ``timeout_ms``: per Manager call (default
60000). ``ttl_ms``: lease time of a lookup (default 30000). ``window_pages``:
``{pool name: pages}``, the window of each sliding-window v2 pool (e.g.
``{"swa": 8}``, ``ceil(sliding_window / page_size)``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

import orbitkv
from orbitkv._chain import lookup_prefix, take_prefix
from orbitkv.hybrid import (
    GroupKind,
    ModelDescription,
    SGLangPool,
    block_key_index,
    checkpoint_key_index,
    from_sglang_pools,
)

logger = logging.getLogger(__name__)

DEFAULT_STAGING_BYTES = 256 << 20
DEFAULT_TIMEOUT_MS = 60000
DEFAULT_TTL_MS = 30000
_GROUP = 0
_MAX_STAT_SAMPLES = 4096


def page_key(key: str) -> bytes:
    """The 32-byte OrbitKV key of an SGLang page hash: sha256 of its UTF-8 text
    (SGLang's hashes are hex strings; any string key works)."""
    if not isinstance(key, str):
        raise TypeError(f"SGLang page keys are str, got {type(key).__name__}")
    return hashlib.sha256(key.encode()).digest()


def pool_format(pool: Any, page_bytes: int) -> str:
    """The byte format of a pool's flat data page, as a namespace part."""
    dtype = str(getattr(pool, "dtype", "")).replace("torch.", "")
    return (
        f"{type(pool).__name__}/{getattr(pool, 'layout', '-')}/{dtype}"
        f"/page={int(getattr(pool, 'page_size', 1) or 1)}/bytes={page_bytes}"
        f"/tag={getattr(pool, 'storage_format_tag', None) or '-'}"
    )


def pool_namespace(
    config: HiCacheStorageConfig, pool_name: str, fmt: str, prefix: str = "sglang",
    tp_sharded: Optional[bool] = None,
) -> str:
    """The OrbitKV namespace of one SGLang host pool, or of a hybrid set of pools
    (`pool_name` joins their names; `tp_sharded` if any of them is sharded);
    see the module docstring."""
    if config.should_split_heads:
        raise ValueError(
            "orbitkv.sglang: should_split_heads (heterogeneous TP sharing) is not supported"
        )
    model = "-".join((config.model_name or "").split("/")) or "unnamed-model"
    pool_name = str(pool_name)
    if tp_sharded is None:
        tp_sharded = is_tp_sharded(config, pool_name)
    parts = [prefix, model, f"pool={pool_name}", fmt]
    parts.append(f"tp={config.tp_rank}/{config.tp_size}" if tp_sharded else "tp=mla-replicated")
    if config.pp_size > 1:
        parts.append(f"pp={config.pp_rank}/{config.pp_size}")
    if config.attn_cp_size > 1:
        parts.append(f"cp={config.attn_cp_rank}/{config.attn_cp_size}")
    if config.dcp_size > 1:
        parts.append(
            f"dcp={config.dcp_rank}/{config.dcp_size}/tp{config.tp_size}"
            f"/page{config.logical_page_size}"
        )
    return "|".join(parts)


def is_tp_sharded(config: HiCacheStorageConfig, pool_name: str) -> bool:
    """Whether a pool's pages differ per TP rank: every pool but MLA KV (which
    SGLang writes once, from its storage writer rank); Mamba state always."""
    return (not config.is_mla_model) or str(pool_name) == PoolName.MAMBA.value


def _positive_int(extra: Dict[str, Any], name: str, default: int) -> int:
    value = extra.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"orbitkv.sglang: extra_config '{name}' must be a positive integer, got {value!r}"
        )
    return value


def _window_pages(extra: Dict[str, Any]) -> Dict[str, int]:
    """extra_config 'window_pages': {pool name: the sliding window in pages}."""
    value = extra.get("window_pages", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
        for k, v in value.items()
    ):
        raise ValueError(
            "orbitkv.sglang: extra_config 'window_pages' must map pool names to positive "
            f"page counts, e.g. {{\"swa\": 8}}; got {value!r}"
        )
    return dict(value)


# Pools whose v2 hit policy is ALL_PAGES (full attention) and TRAILING_PAGES of
# recurrent state; a sliding-window pool is one named in extra_config 'window_pages'.
_ALL_PAGES_POOLS = (PoolName.KV.value, PoolName.INDEXER.value)
_RECURRENT_POOLS = (PoolName.MAMBA.value,)


def _slot_sizes(page_bytes: int) -> List[int]:
    """A page as slots of at most MAX_SLOT_BYTES each."""
    limit = orbitkv.MAX_SLOT_BYTES
    return [min(limit, page_bytes - off) for off in range(0, page_bytes, limit)]


class _PoolBinding:
    """One SGLang host pool, registered as one OrbitKV instance whose only region
    is a staging area of whole pages; moves pages pool <-> staging <-> Manager.

    Dense (``register()``): the instance holds one storage group of the pool's
    pages in the pool's own namespace. Hybrid (``register(namespace, group,
    model)``): every pool of a v2 set registers an instance with the same model
    description and namespace, holding only its own storage group ``group``; a
    query of any of them returns the Manager's recovery plan over every group
    (orbitkv.hybrid), of which each pool restores its own pieces."""

    def __init__(
        self,
        client: orbitkv.Client,
        name: str,
        pool: Any,
        config: HiCacheStorageConfig,
        prefix: str,
        staging_bytes: int,
        ttl_ms: int,
    ):
        dummy = pool.get_dummy_flat_data_page()
        self.name = name
        self.pool = pool
        self.config = config
        self.page_dtype = dummy.dtype
        self.page_bytes = dummy.numel() * dummy.element_size()
        if self.page_bytes <= 0:
            raise ValueError(f"orbitkv.sglang: pool {name!r} has empty pages")
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        self.format = pool_format(pool, self.page_bytes)
        self.namespace = pool_namespace(config, name, self.format, prefix)
        self.num_pages = max(1, staging_bytes // self.page_bytes)
        self.ttl_ms = ttl_ms
        self._client = client
        self.region = orbitkv.HostPages(self.num_pages * self.page_bytes, f"orbitkv-sglang-{name}")
        self.staging = torch.frombuffer(self.region, dtype=torch.uint8)
        self.instance = 0  # registered by register()
        self.group = _GROUP
        self.model: Optional[ModelDescription] = None
        self._free = list(range(self.num_pages))
        self._cv = threading.Condition()

    def register(self, namespace: Optional[str] = None, group: int = _GROUP,
                 model: Optional[ModelDescription] = None) -> None:
        """Registers the instance: dense in the pool's namespace, or (with
        `model`) as storage group `group` of a hybrid set in `namespace`."""
        if model is not None:
            self.namespace, self.group, self.model = namespace, group, model
        layout = orbitkv.page_first_layout(self.num_pages, _slot_sizes(self.page_bytes),
                                           group_id=self.group)
        kw = {"model": model} if model is not None else {}
        self.instance = self._client.register_instance(
            self.namespace, self.config.tp_rank, "host", layout, [self.region], **kw
        )

    # -- staging pages
    def _acquire(self, want: int) -> List[int]:
        with self._cv:
            while not self._free:
                self._cv.wait()
            n = min(want, len(self._free))
            taken, self._free = self._free[:n], self._free[n:]
            return taken

    def _release(self, pages: Sequence[int]) -> None:
        with self._cv:
            self._free.extend(pages)
            self._cv.notify_all()

    def _staging_page(self, page: int) -> torch.Tensor:
        start = page * self.page_bytes
        return self.staging[start : start + self.page_bytes]

    # -- copies
    def _to_staging(self, page: int, data: torch.Tensor) -> None:
        nbytes = data.numel() * data.element_size()
        if nbytes != self.page_bytes:
            raise ValueError(
                f"orbitkv.sglang: pool {self.name!r} page is {nbytes} bytes, expected "
                f"{self.page_bytes}"
            )
        self._staging_page(page).view(data.dtype).view(data.shape).copy_(data)

    def _pool_page_to_staging(self, page: int, index: int) -> None:
        self._to_staging(page, self.pool.get_data_page(index, flat=False))

    def _staging_to_pool_page(self, page: int, index: int) -> None:
        self.pool.set_from_flat_data_page(index, self._staging_page(page).view(self.page_dtype))

    # -- Manager operations
    def _query(self, keys: Sequence[bytes]):
        return self._client.query(self.instance, self.group, list(keys), self.ttl_ms)

    def _release_query(self, query: int) -> None:
        self._client.release_query(self.instance, query)

    def present(self, keys: Sequence[str]) -> int:
        """Longest prefix of ``keys`` the Manager can restore. A lookup cut by the
        Manager's query byte budget is released and followed by one for the rest
        (orbitkv._chain.lookup_prefix)."""
        if not keys:
            return 0
        if self.model is not None:
            return self._planned_pages(keys)
        return lookup_prefix([page_key(k) for k in keys], self._query, self._release_query).blocks

    def _planned_pages(self, keys: Sequence[str]) -> int:
        """Hybrid: the pages of the Manager's recovery plan over `keys` (the
        longest prefix every pool of the set can resume at). Object keys do not
        depend on where the chain starts, so a span's keys plan as SGLang's
        hit policies ask: every KV page of the span, a window's pages before
        the hit, the recurrent state at it. A plan cut by the query byte budget
        answers its (shorter) P."""
        q = self._query([page_key(k) for k in keys])
        try:
            return int(q.prefix_tokens) // self.model.key_block_tokens
        finally:
            self._release_query_if_live(q.query)

    def _abandon_query(self, query: int) -> None:
        """Releases a query after its restore failed (the restore's own error is
        the one to raise)."""
        try:
            self._release_query(query)
        except orbitkv.OrbitKVError:
            pass

    def _release_query_if_live(self, query: int) -> None:
        try:
            self._release_query(query)
        except orbitkv.NotFoundError:
            pass  # every source was taken by restores: nothing left to release

    def present_each(self, keys: Sequence[str]) -> List[bool]:
        """Presence of each key on its own (one lookup per key)."""
        return [self.present([k]) == 1 for k in keys]

    def store(self, keys: Sequence[str], copy_in) -> List[bool]:
        """Publishes ``keys[i]`` with the page ``copy_in(staging_page, i)`` writes
        into staging. Returns per key whether it is stored."""
        results: List[bool] = []
        done = 0
        while done < len(keys):
            pages = self._acquire(len(keys) - done)
            try:
                chunk = list(keys[done : done + len(pages)])
                for j, page in enumerate(pages):
                    copy_in(page, done + j)
                r = self._client.publish(
                    self.instance, self.group, [page_key(k) for k in chunk], pages
                )
            finally:
                self._release(pages)
            if r.dropped and self.model is not None:
                # Which ones did not make it cannot be asked of one group of a hybrid
                # set (a query plans every group): none counts as stored.
                logger.warning(
                    "orbitkv.sglang: the Manager dropped %d of %d pages of %s (DRAM pool full)",
                    r.dropped, len(chunk), self.name,
                )
                results += [False] * len(chunk)
            elif r.dropped:
                # The pool had no room for some; ask which prefix made it.
                logger.warning(
                    "orbitkv.sglang: the Manager dropped %d of %d pages of %s (DRAM pool full)",
                    r.dropped, len(chunk), self.name,
                )
                stored = self.present(chunk)
                results += [j < stored for j in range(len(chunk))]
            else:
                results += [True] * len(chunk)
            done += len(chunk)
        return results

    def load(self, keys: Sequence[str], copy_out) -> List[bool]:
        """Restores the longest present prefix of ``keys``; ``copy_out(staging_page,
        i)`` takes page i out of staging. Returns per key whether it was loaded
        (False from the first page missing or failed on)."""
        if self.model is not None:
            return self._load_planned(keys, copy_out)
        loaded = 0
        while loaded < len(keys):
            pages = self._acquire(len(keys) - loaded)
            try:
                chunk = list(keys[loaded : loaded + len(pages)])
                got = self._load_chunk(chunk, pages, loaded, copy_out)
            finally:
                self._release(pages)
            loaded += got
            if got < len(chunk):
                break
        return [i < loaded for i in range(len(keys))]

    def _key_index(self, piece) -> int:
        """The index in the queried keys of the page a plan piece restores: a
        block's, or the page a recurrent checkpoint ends."""
        g = self.model.groups[piece.group]
        if g.kind == GroupKind.RECURRENT:
            return checkpoint_key_index(self.model, piece.index)
        return block_key_index(self.model, g, piece.index)

    def _load_planned(self, keys: Sequence[str], copy_out) -> List[bool]:
        """Hybrid: plans `keys` (see _planned_pages) and restores this pool's
        pieces of the plan through staging, in chunks of the staging pages;
        releases the rest. True per key up to the first page that is not in
        the plan or failed."""
        q = self._query([page_key(k) for k in keys])
        ok = set()
        try:
            mine = [(i, self._key_index(p)) for i, p in enumerate(q.pieces)
                    if p.storage_group == self.group]
            done = 0
            while done < len(mine):
                pages = self._acquire(len(mine) - done)
                try:
                    chunk = mine[done : done + len(pages)]
                    results = self._client.restore(
                        self.instance, q.query, [i for i, _ in chunk], pages[: len(chunk)]
                    )
                    for (_, key), page, res in zip(chunk, pages, results):
                        if res.ok:
                            copy_out(page, key)
                            ok.add(key)
                        else:
                            logger.warning(
                                "orbitkv.sglang: restoring page %d (key %s) of %s failed: %s",
                                key, keys[key], self.name, res.error,
                            )
                finally:
                    self._release(pages)
                done += len(chunk)
        except BaseException:
            self._abandon_query(q.query)
            raise
        self._release_query_if_live(q.query)
        out, good = [], True
        for j in range(len(keys)):
            good = good and j in ok
            out.append(good)
        return out

    def _load_chunk(self, chunk, pages, base, copy_out) -> int:
        """Restores the longest present prefix of ``chunk`` (keys base.. of the
        call) into staging ``pages`` and copies it out; a query cut by the
        Manager's query byte budget is followed, once restored, by one for the
        rest (orbitkv._chain.take_prefix). Returns the pages loaded."""

        def take(q, done: int) -> int:
            try:
                # Every block of the prefix: the Manager ends the query with it.
                results = self._client.restore(
                    self.instance, q.query, list(range(q.prefix)), pages[done : done + q.prefix]
                )
            except BaseException:
                self._abandon_query(q.query)
                raise
            for j, res in enumerate(results):
                if not res.ok:
                    logger.warning(
                        "orbitkv.sglang: restoring page %d (key %s) of %s failed: %s",
                        base + done + j, chunk[done + j], self.name, res.error,
                    )
                    return j
                copy_out(pages[done + j], base + done + j)
            return q.prefix

        return take_prefix([page_key(k) for k in chunk], self._query, take).blocks

    def close(self) -> None:
        """Frees the staging region (after the connection closed: the Manager
        unregisters a closed connection's instances itself)."""
        self.staging = None
        self.region.close()


class OrbitKVStorage(HiCacheStorage):
    """SGLang HiCache L3 storage on an OrbitKV Manager (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        if not isinstance(storage_config, HiCacheStorageConfig):
            raise TypeError(
                "OrbitKVStorage needs a HiCacheStorageConfig, got "
                f"{type(storage_config).__name__}"
            )
        extra = dict(storage_config.extra_config or {})
        self.config = storage_config
        self.socket_path = extra.get("socket") or os.environ.get("ORBITKV_SOCKET") or ""
        self.prefix = str(extra.get("namespace", "sglang"))
        if not self.prefix or "|" in self.prefix:
            raise ValueError(
                f"orbitkv.sglang: extra_config 'namespace' must be non-empty without '|', "
                f"got {self.prefix!r}"
            )
        self.staging_bytes = _positive_int(extra, "staging_bytes", DEFAULT_STAGING_BYTES)
        self.window_pages = _window_pages(extra)
        self.ttl_ms = _positive_int(extra, "ttl_ms", DEFAULT_TTL_MS)
        timeout_ms = _positive_int(extra, "timeout_ms", DEFAULT_TIMEOUT_MS)
        if storage_config.should_split_heads:
            raise ValueError(
                "orbitkv.sglang: should_split_heads (heterogeneous TP sharing) is not supported"
            )
        self._client = orbitkv.Client(
            self.socket_path,
            timeout_ms=timeout_ms,
            client_name=f"sglang-tp{storage_config.tp_rank}-pp{storage_config.pp_rank}",
        )
        self._bindings: Dict[str, _PoolBinding] = {}  # in registration order, KV first
        self._bind_lock = threading.Lock()
        self._finalized = False  # instances registered (on_host_pools_registered or first use)
        self.hybrid: Optional[ModelDescription] = None
        self._stats_lock = threading.Lock()
        self._stats = {"prefetch_pgs": [], "prefetch_bandwidth": [],
                       "backup_pgs": [], "backup_bandwidth": []}
        self.mem_pool_host = None

    # -- pool registration
    def _bind(self, name: str, pool: Any) -> _PoolBinding:
        name = str(name)
        with self._bind_lock:
            bound = self._bindings.get(name)
            if bound is not None:
                if bound.pool is not pool:
                    raise ValueError(f"orbitkv.sglang: another host pool is already bound as {name!r}")
                return bound
            if self._finalized and self.hybrid is not None:
                raise ValueError(
                    f"orbitkv.sglang: pool {name!r} registered after the hybrid pool set "
                    f"{sorted(self._bindings)} was registered with the Manager (a model "
                    "description cannot be amended)"
                )
            bound = _PoolBinding(
                self._client, name, pool, self.config, self.prefix, self.staging_bytes, self.ttl_ms
            )
            self._bindings[name] = bound
            if self._finalized:  # a dynamic sidecar of a dense set: its own instance
                self._register_dense([bound])
            return bound

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._bind(PoolName.KV.value, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._bind(str(host_pool_name), host_pool)

    def on_host_pools_registered(self) -> None:
        """SGLang's pool set is complete: registers the instances (see _finalize)."""
        self._finalize()

    def _finalize(self) -> None:
        """Registers every pool's instance, once. A KV pool alone is dense. KV
        with v2 pools that all map to a model description (kv and indexer:
        full attention; mamba: a checkpoint at every page; a pool named in
        extra_config 'window_pages': a window of that many pages) is one hybrid
        set: the Manager plans their hits together and restores each pool's
        pieces. Otherwise every pool is dense and batch_exists_v2 combines their
        answers here (see batch_exists_v2)."""
        with self._bind_lock:
            if self._finalized:
                return
            # KV first: it is storage group 0 of a hybrid set.
            bindings = sorted(self._bindings.values(), key=lambda b: b.name != PoolName.KV.value)
            self._bindings = {b.name: b for b in bindings}
            model, why = None, ""
            if len(bindings) > 1 and PoolName.KV.value in self._bindings:
                try:
                    model = self._describe(bindings)
                except ValueError as e:
                    why = str(e)
            if model is None:
                if why:
                    logger.info("orbitkv.sglang: v2 pools %s are looked up one by one: %s",
                                [b.name for b in bindings], why)
                self._register_dense(bindings)
            else:
                names = "+".join(b.name for b in bindings)
                ns = pool_namespace(
                    self.config, names, ";".join(b.format for b in bindings), self.prefix,
                    tp_sharded=any(is_tp_sharded(self.config, b.name) for b in bindings),
                )
                for group, b in enumerate(bindings):
                    b.register(ns, group, model)
                    self._log_registered(b)
                self.hybrid = model
            self._finalized = True

    def _describe(self, bindings: List[_PoolBinding]) -> ModelDescription:
        """The model description of a v2 pool set, KV first: storage group i is
        bindings[i] (ValueError naming a pool without a mapping)."""
        pools = []
        for b in bindings:
            if b.name in _ALL_PAGES_POOLS:
                pools.append(SGLangPool(b.name, PoolHitPolicy.ALL_PAGES, b.page_bytes))
            elif b.name in _RECURRENT_POOLS:
                pools.append(SGLangPool(b.name, PoolHitPolicy.TRAILING_PAGES, b.page_bytes,
                                        recurrent=True))
            elif b.name in self.window_pages:
                pools.append(SGLangPool(b.name, PoolHitPolicy.TRAILING_PAGES, b.page_bytes,
                                        trailing_pages=self.window_pages[b.name], recurrent=False))
            else:
                raise ValueError(
                    f"pool {b.name!r} has no OrbitKV model mapping (a sliding-window pool "
                    f"needs its window in extra_config 'window_pages', e.g. {{\"{b.name}\": 8}})"
                )
        return from_sglang_pools(pools, bindings[0].page_size)

    def _register_dense(self, bindings: List[_PoolBinding]) -> None:
        for b in bindings:
            if not b.instance:
                b.register()
                self._log_registered(b)

    @staticmethod
    def _log_registered(b: _PoolBinding) -> None:
        logger.info(
            "orbitkv.sglang: pool %s -> instance %d (group %d%s), namespace %s, %d staging "
            "pages of %d bytes", b.name, b.instance, b.group,
            ", hybrid" if b.model is not None else "", b.namespace, b.num_pages, b.page_bytes,
        )

    def _binding(self, name: Any = PoolName.KV.value) -> _PoolBinding:
        bound = self._bindings.get(str(name))
        if bound is None:
            raise RuntimeError(
                f"orbitkv.sglang: no host pool registered as {str(name)!r} "
                f"(registered: {sorted(self._bindings)})"
            )
        if not self._finalized:
            self._finalize()  # used before on_host_pools_registered
        return bound

    @staticmethod
    def _page_indices(bound: _PoolBinding, n: int, host_indices: torch.Tensor) -> List[int]:
        if host_indices is None or host_indices.numel() != n * bound.page_size:
            got = 0 if host_indices is None else host_indices.numel()
            raise ValueError(
                f"orbitkv.sglang: {n} keys of pool {bound.name!r} need {n * bound.page_size} "
                f"host indices ({bound.page_size} per page), got {got}"
            )
        return host_indices[:: bound.page_size].tolist()

    def _record(self, kind: str, pages: int, seconds: float, bytes_per_page: int) -> None:
        with self._stats_lock:
            pgs, bw = self._stats[f"{kind}_pgs"], self._stats[f"{kind}_bandwidth"]
            if len(pgs) < _MAX_STAT_SAMPLES:
                pgs.append(pages)
                bw.append(pages * bytes_per_page / 1e9 / max(seconds, 1e-9))

    def _load_pages(self, bound, keys, host_indices) -> List[bool]:
        idx = self._page_indices(bound, len(keys), host_indices)
        t0 = time.perf_counter()
        res = bound.load(keys, lambda page, i: bound._staging_to_pool_page(page, idx[i]))
        self._record("prefetch", sum(res), time.perf_counter() - t0, bound.page_bytes)
        return res

    def _store_pages(self, bound, keys, host_indices) -> List[bool]:
        idx = self._page_indices(bound, len(keys), host_indices)
        t0 = time.perf_counter()
        res = bound.store(keys, lambda page, i: bound._pool_page_to_staging(page, idx[i]))
        self._record("backup", sum(res), time.perf_counter() - t0, bound.page_bytes)
        return res

    # -- v1: pages of the KV host pool
    def batch_exists(
        self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> int:
        return self._binding().present(keys)

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._load_pages(self._binding(), keys, host_indices)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        return self._store_pages(self._binding(), keys, host_indices)

    # -- single keys: flat data pages of the KV pool (SGLang's generic path)
    def exists(self, key: str) -> bool:
        return self._binding().present([key]) == 1

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        out = self.batch_get([key], [target_location])
        return out[0]

    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> List[Optional[torch.Tensor]]:
        bound = self._binding()
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        if len(targets) != len(keys):
            raise ValueError(f"orbitkv.sglang: {len(keys)} keys but {len(targets)} targets")
        for i, t in enumerate(targets):
            if t is None:
                targets[i] = bound.pool.get_dummy_flat_data_page()
            elif t.numel() * t.element_size() != bound.page_bytes or not t.is_contiguous():
                raise ValueError(
                    f"orbitkv.sglang: target {i} must be a contiguous {bound.page_bytes}-byte "
                    f"page, got {t.numel() * t.element_size()} bytes"
                )

        def copy_out(page: int, i: int) -> None:
            targets[i].view(torch.uint8).view(-1).copy_(bound._staging_page(page))

        ok = bound.load(keys, copy_out)
        return [t if hit else None for t, hit in zip(targets, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        if values is None or len(values) != len(keys):
            raise ValueError(
                f"orbitkv.sglang: batch_set needs one page tensor per key ({len(keys)} keys)"
            )
        bound = self._binding()
        for v in values:
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"orbitkv.sglang: page values are tensors, got {type(v).__name__}")
        return all(bound.store(keys, lambda page, i: bound._to_staging(page, values[i])))

    # -- v2: hybrid pools
    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        """KV: the longest present prefix. Then per extra pool, computed here from
        per-page presence (the Manager answers one chain per group; compiled
        hybrid requirements are issue 14): ALL_PAGES needs every page of [0, P),
        TRAILING_PAGES the last len(transfer.keys) pages before P (at least 1).
        The result lists every prefix length P all pools can restore.

        A hybrid set asks the Manager once: its recovery plan over `keys` is the
        hit of every pool (P pages; restorable_prefix_pages lists only P)."""
        kv = self._binding()
        if self.hybrid is not None:
            return self._exists_planned(kv, keys, pool_transfers or [])
        kv_pages = kv.present(keys)
        hit_count: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            bound = self._binding(transfer.name)
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = bound.present(keys[:kv_pages])
                pool_ok = set(range(1, boundary + 1))
            elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(transfer.keys) if transfer.keys else 1)
                have = bound.present_each(keys[:kv_pages])
                pool_ok = {
                    p for p in range(1, kv_pages + 1) if all(have[max(0, p - window) : p])
                }
                boundary = max(pool_ok, default=0)
            else:
                raise ValueError(
                    f"orbitkv.sglang: hit policy {transfer.hit_policy} of pool {transfer.name} "
                    "is not supported"
                )
            if boundary:
                hit_count[transfer.name] = boundary
            restorable = [p for p in restorable if p in pool_ok]
        final = restorable[-1] if restorable else 0
        return PoolTransferResult(final, hit_count, restorable)

    def _exists_planned(self, kv: _PoolBinding, keys, transfers) -> PoolTransferResult:
        for t in transfers:
            g = self.hybrid.groups[self._binding(t.name).group]
            if t.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                raise ValueError(
                    f"orbitkv.sglang: hit policy {t.hit_policy} of pool {t.name} is not supported"
                )
            if g.kind == GroupKind.SLIDING_WINDOW and len(t.keys or []) * kv.page_size > g.window_tokens:
                logger.warning(
                    "orbitkv.sglang: pool %s is asked for %d trailing pages, its window "
                    "(extra_config window_pages) is %d: loads may miss pages",
                    t.name, len(t.keys or []), g.window_tokens // kv.page_size,
                )
        pages = kv.present(keys)
        if not pages:
            return PoolTransferResult(0, {}, [])
        hits = {PoolName.KV: pages}
        hits.update({t.name: pages for t in transfers})
        return PoolTransferResult(pages, hits, [pages])

    def batch_get_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> Dict[Any, List[bool]]:
        return {
            t.name: self._load_pages(self._binding(t.name), t.keys or [], t.host_indices)
            for t in transfers
        }

    def batch_set_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> Dict[Any, List[bool]]:
        return {
            t.name: self._store_pages(self._binding(t.name), t.keys or [], t.host_indices)
            for t in transfers
        }

    # -- management
    def clear(self) -> None:
        """Drops every object of this storage's pools' namespaces from the Manager
        (DRAM and SSD). Other engines' namespaces, and other TP ranks', are
        untouched. Raises if the Manager cannot be reached."""
        if self._bindings:
            self._finalize()
        with self._bind_lock:
            bindings = list(self._bindings.values())
        for b in bindings:
            self._client.clear_namespace(b.instance)

    def get_stats(self):
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        with self._stats_lock:
            for name, values in self._stats.items():
                getattr(m, name).extend(values)
                values.clear()
        return m

    def close(self) -> None:
        """Closes the connection (the Manager unregisters its instances, also when
        it is already gone) and frees the staging regions. Idempotent."""
        with self._bind_lock:
            bindings, self._bindings = list(self._bindings.values()), {}
        if not self._client.closed:
            self._client.close()
        for b in bindings:
            b.close()
