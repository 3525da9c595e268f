"""OrbitKVConnector: vLLM's KV connector (KVConnectorBase_V1) over an OrbitKV Manager.

Enable it with::

    --kv-transfer-config '{"kv_connector":"OrbitKVConnector",
      "kv_connector_module_path":"orbitkv.vllm","kv_role":"kv_both",
      "kv_connector_extra_config":{"socket_path":"/run/orbitkv.sock"}}'

This file only adapts vLLM's objects; the logic is in the vLLM-free
:mod:`orbitkv.vllm.scheduler` (role SCHEDULER, in the engine core) and
:mod:`orbitkv.vllm.worker` (role WORKER, one per TP/PP rank). The plan of a
step travels from one to the other inside :class:`OrbitKVConnectorMetadata`.
Saves are published in ``wait_for_save`` once the step's forward is done
(``save_kv_layer`` has nothing to do: the Manager takes whole blocks).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import launch
from .config import ConnectorConfig
from .keys import layout_fingerprint, namespace
from .layout import describe_kv_caches
from .plan import StepPlan
from .scheduler import SchedulerCore
from .worker import WorkerCore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("orbitkv.vllm")

_TIER_SOURCE = {"dram": CacheHitSource.HOST, "ssd": CacheHitSource.DISK}


class OrbitKVConnectorMetadata(KVConnectorMetadata):
    """One step's :class:`~orbitkv.vllm.plan.StepPlan` (picklable; JSON via plan.to_json())."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class OrbitKVConnectorStats(KVConnectorStats):
    """Counters of the scheduler side (queries, hits by tier) and of the
    workers (restored / saved blocks and bytes), summed over ranks."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, int]:
        return {k: v for k, v in sorted(self.data.items()) if v}

    def is_empty(self) -> bool:
        return not any(self.data.values())


def _group_spec(kv_cache_config: "KVCacheConfig"):
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(
            f"OrbitKVConnector stores one KV cache group; this model has {len(groups)} "
            "(hybrid models are not supported yet: run with --disable-hybrid-kv-cache-manager)"
        )
    return groups[0].kv_cache_spec


def layout_parts(kv_cache_config: "KVCacheConfig") -> List[str]:
    """What the namespace's layout fingerprint covers, from the KV cache config."""
    spec = _group_spec(kv_cache_config)
    fields = [type(spec).__name__]
    for name in ("block_size", "num_kv_heads", "head_size", "head_size_v", "sliding_window",
                 "attention_chunk_size", "kv_quant_mode", "page_size_padded"):
        if hasattr(spec, name):
            fields.append(f"{name}={getattr(spec, name)}")
    fields.append(f"kv_cache_layout={kv_cache_config.kv_cache_layout or 'NHD'}")
    return fields


def rank_namespaces(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                    cfg: ConnectorConfig) -> Dict[tuple, str]:
    """(tp_rank, pp_rank) -> namespace, for every rank of this engine."""
    spec = _group_spec(kv_cache_config)
    par = vllm_config.parallel_config
    tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
    model = cfg.model_id or vllm_config.model_config.model
    dtype = str(spec.dtype).replace("torch.", "")
    fp = layout_fingerprint(layout_parts(kv_cache_config))
    return {
        (t, p): namespace(model, dtype, spec.block_size, fp, t, tp, p, pp)
        for p in range(pp)
        for t in range(tp)
    }


def rank_slot_bytes(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                    pp_rank: int) -> List[int]:
    """The slot sizes of one block on a rank of pipeline stage `pp_rank`, as the
    worker registers them (orbitkv.vllm.layout): a K and a V slot per layer, or
    one slot per layer for MLA. Every instance of a namespace must agree."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    spec = _group_spec(kv_cache_config)
    layers = list(kv_cache_config.kv_cache_groups[0].layer_names)
    pp = vllm_config.parallel_config.pipeline_parallel_size
    if pp > 1:
        from vllm.distributed.utils import get_pp_indices
        from vllm.model_executor.models.utils import extract_layer_index

        total = vllm_config.model_config.get_total_num_hidden_layers()
        start, end = get_pp_indices(total, pp_rank, pp)
        layers = [n for n in layers if start <= extract_layer_index(n) < end]
    page = spec.page_size_bytes
    if isinstance(spec, MLAAttentionSpec):
        return [page] * len(layers)
    return [page // 2] * (2 * len(layers))


def _this_rank() -> tuple:
    """(tp_rank, pp_rank) of this worker; (0, 0) without vLLM's distributed groups."""
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 0
    return ps.get_tensor_model_parallel_rank(), ps.get_pp_group().rank_in_group


class OrbitKVConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig",
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._cfg = ConnectorConfig.from_extra_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        if kv_cache_config is None:
            raise ValueError("OrbitKVConnector needs the KV cache config (vLLM >= 0.33)")
        spec = _group_spec(kv_cache_config)
        self._block_size = spec.block_size
        self._namespaces = rank_namespaces(vllm_config, kv_cache_config, self._cfg)
        if self._cfg.start_manager:
            launch.ensure_manager(self._cfg)
        self._sched: Optional[SchedulerCore] = None
        self._worker: Optional[WorkerCore] = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = SchedulerCore(
                self._cfg,
                [
                    (self._namespaces[k], rank_slot_bytes(vllm_config, kv_cache_config, k[1]))
                    for k in sorted(self._namespaces)
                ],
                self._block_size,
                hash_block_size=kv_cache_config.hash_block_size,
            )
        else:
            tp_rank, pp_rank = _this_rank()
            self._slot_bytes = rank_slot_bytes(vllm_config, kv_cache_config, pp_rank)
            ns = self._namespaces[(tp_rank, pp_rank)]
            rank = pp_rank * vllm_config.parallel_config.tensor_parallel_size + tp_rank
            self._worker = WorkerCore(self._cfg, ns, rank)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a later miss

    # ---- scheduler side ----------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> tuple:
        assert self._sched is not None
        blocks = self._sched.num_new_matched_blocks(
            request.request_id,
            request.block_hashes,
            request.cache_salt,
            request.num_prompt_tokens,
            request.num_tokens,
            num_computed_tokens,
        )
        if blocks == 0:
            return 0, False
        return blocks * self._block_size, self._cfg.load_policy == "async"

    def get_external_cache_hit_sources(
        self, request: "Request", num_external_tokens: int
    ) -> Dict[CacheHitSource, int]:
        assert self._sched is not None
        if num_external_tokens == 0:
            return {}
        n = num_external_tokens // self._block_size
        out: Dict[CacheHitSource, int] = {}
        for tier, blocks in self._sched.hit_tiers(request.request_id, n).items():
            src = _TIER_SOURCE.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[src] = out.get(src, 0) + blocks * self._block_size
        rest = num_external_tokens - sum(out.values())
        if rest:
            out[CacheHitSource.EXTERNAL_UNSPECIFIED] = out.get(CacheHitSource.EXTERNAL_UNSPECIFIED, 0) + rest
        return out

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        assert self._sched is not None
        if num_external_tokens > 0:
            self._sched.after_alloc(
                request.request_id, blocks.get_block_ids()[0], num_external_tokens
            )

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._sched is not None
        so = scheduler_output
        cached = so.scheduled_cached_reqs
        new_reqs = [(r.req_id, r.block_ids[0], r.num_computed_tokens) for r in so.scheduled_new_reqs]
        cached_reqs = [
            (
                req_id,
                None if cached.new_block_ids[i] is None else cached.new_block_ids[i][0],
                req_id in cached.resumed_req_ids,
                cached.num_computed_tokens[i],
            )
            for i, req_id in enumerate(cached.req_ids)
        ]
        spec = {r: len(t) for r, t in (so.scheduled_spec_decode_tokens or {}).items()}
        plan = self._sched.build_plan(
            new_reqs, cached_reqs, dict(so.num_scheduled_tokens), spec,
            set(so.preempted_req_ids or ()),
        )
        return OrbitKVConnectorMetadata(plan)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        assert self._sched is not None
        self._sched.on_output(
            set(connector_output.finished_recving or ()),
            set(connector_output.invalid_block_ids or ()),
        )

    def request_finished(self, request: "Request", block_ids: List[int]) -> tuple:
        assert self._sched is not None
        return self._sched.request_finished(request.request_id), None

    # ---- worker side -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        layout = describe_kv_caches(kv_caches, self._kv_cache_config.num_blocks)
        got = [s.bytes_per_page for s in layout.slots]
        if got != self._slot_bytes:
            raise ValueError(
                f"OrbitKVConnector: the KV tensors give {len(got)} slots per block "
                f"({sorted(set(got))} bytes), the KV cache config {len(self._slot_bytes)} "
                f"({sorted(set(self._slot_bytes))} bytes)"
            )
        self._worker.register(layout)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert self._worker is not None
        self._worker.handle_preemptions(_plan(kv_connector_metadata))

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load(_plan(self._get_connector_metadata()))

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self._worker is not None
        self._worker.wait_for_layer_load()

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
        **kwargs: Any,
    ) -> None:
        return  # blocks are published whole, in wait_for_save

    def wait_for_save(self) -> None:
        assert self._worker is not None
        plan = _plan(self._get_connector_metadata())
        ready = None
        if plan.saves and torch.cuda.is_available() and torch.cuda.is_initialized():
            event = torch.cuda.Event()
            event.record()
            ready = event.synchronize
        self._worker.save(plan, ready)

    def get_finished(self, finished_req_ids: set) -> tuple:
        assert self._worker is not None
        self._worker.wait_for_layer_load()  # a sync load's errors belong to this step
        sending, recving = self._worker.get_finished()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self) -> set:
        assert self._worker is not None
        return self._worker.take_load_errors()

    # ---- both ---------------------------------------------------------------

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        core = self._sched if self._sched is not None else self._worker
        data = {k: v for k, v in core.take_stats().items() if v}
        return OrbitKVConnectorStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> KVConnectorStats:
        return OrbitKVConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._sched is not None:
            self._sched.close()


def _plan(meta: KVConnectorMetadata) -> StepPlan:
    if not isinstance(meta, OrbitKVConnectorMetadata):
        raise TypeError(f"OrbitKVConnector got {type(meta).__name__} metadata")
    return meta.plan
