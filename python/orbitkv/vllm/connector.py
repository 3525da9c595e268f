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

Hybrid models (``SupportsHMA``: several KV cache groups of full attention,
sliding-window and Mamba layers) register one storage group per KV cache group
under the model description :func:`orbitkv.hybrid.from_vllm_kv_cache_config`
makes; the scheduler's hit is the recovery plan's ``prefix_tokens``, loads
restore each piece into its group's blocks, a failed load is a failed request
(``failed_recving``: vLLM's hybrid scheduler takes no block ids). Mamba groups
(``MambaSpec``, vLLM's prefix caching in ``mamba_cache_mode="align"``) store
their state as recurrent checkpoints: each (group, block, boundary) that vLLM
hands over in ``KVConnectorBlockState.boundary_state_offloads`` is published
as the checkpoint after ``boundary`` tokens, and a hit restores the checkpoint
at exactly the hit into the block vLLM allocated for it (block ``P / block_size
- 1`` of the group). Models with Mamba groups are always hybrid, one group or
several.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from orbitkv.hybrid import ModelDescription, from_vllm_kv_cache_config

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


def _group_spec(kv_cache_config: "KVCacheConfig", vllm_config: Optional["VllmConfig"] = None):
    """The spec of the first attention KV cache group (else of group 0); every
    group must be one the connector stores, on one block size. Mamba groups
    need vLLM's prefix caching in mamba_cache_mode 'align' (vLLM keeps no
    state per block otherwise), checked against `vllm_config` when given."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise ValueError("OrbitKVConnector: the KV cache config has no KV cache groups")
    first = groups[0].kv_cache_spec
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if isinstance(spec, MambaSpec):
            _check_mamba(i, spec, vllm_config)
        elif not isinstance(spec, AttentionSpec):
            raise ValueError(
                f"OrbitKVConnector: KV cache group {i} is a {type(spec).__name__}; the connector "
                "stores full-attention, sliding-window and Mamba groups")
        if spec.block_size != first.block_size:
            raise ValueError(
                f"OrbitKVConnector: KV cache group {i} has block size {spec.block_size}, group 0 "
                f"{first.block_size} (the connector needs one block size)")
    return next((g.kv_cache_spec for g in groups if isinstance(g.kv_cache_spec, AttentionSpec)),
                first)


def _check_mamba(i: int, spec: Any, vllm_config: Optional["VllmConfig"]) -> None:
    """A Mamba group the connector can checkpoint, or ValueError saying what to set."""
    cache = vllm_config.cache_config if vllm_config is not None else None
    if cache is not None and not cache.enable_prefix_caching:
        raise ValueError(
            f"OrbitKVConnector: KV cache group {i} is Mamba state ({type(spec).__name__}) and "
            "prefix caching is off: vLLM then keeps one running state per request and no state "
            "per block, which nothing could restore (enable prefix caching; vLLM uses "
            "--mamba-cache-mode align with it)")
    mode = cache.mamba_cache_mode if cache is not None else spec.mamba_cache_mode
    if mode != "align" or spec.mamba_cache_mode != "align":
        raise ValueError(
            f"OrbitKVConnector: KV cache group {i} is Mamba state with mamba_cache_mode "
            f"{spec.mamba_cache_mode!r}; the connector stores Mamba state as checkpoints at "
            "block boundaries, which vLLM keeps only in 'align' mode (--mamba-cache-mode align)")
    if spec.num_speculative_blocks:
        raise ValueError(
            f"OrbitKVConnector: KV cache group {i} is Mamba state with "
            f"{spec.num_speculative_blocks} speculative blocks (MTP/EAGLE): vLLM relocates "
            "those blocks in place; speculative decoding with Mamba groups is not supported yet")


def _is_mamba(spec: Any) -> bool:
    from vllm.v1.kv_cache_interface import MambaSpec

    return isinstance(spec, MambaSpec)


def mamba_state_bytes(spec: Any) -> List[int]:
    """Bytes of each state (conv, SSM, ...) a layer of a Mamba group keeps per block."""
    from vllm.utils.torch_utils import get_dtype_size

    return [math.prod(shape) * get_dtype_size(dtype)
            for shape, dtype in zip(spec.shapes, spec.dtypes)]


def layout_parts(kv_cache_config: "KVCacheConfig") -> List[str]:
    """What the namespace's layout fingerprint covers, from the KV cache config
    (every group's spec; one group gives what it gave before hybrid support)."""
    _group_spec(kv_cache_config)
    fields = []
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if i:
            fields.append(f"group{i}")
        fields.append(type(spec).__name__)
        for name in ("block_size", "num_kv_heads", "head_size", "head_size_v", "sliding_window",
                     "attention_chunk_size", "kv_quant_mode", "page_size_padded", "shapes",
                     "mamba_type"):
            if hasattr(spec, name):
                fields.append(f"{name}={getattr(spec, name)}")
        if _is_mamba(spec):
            fields.append("dtypes=" + ",".join(str(d).replace("torch.", "") for d in spec.dtypes))
    fields.append(f"kv_cache_layout={kv_cache_config.kv_cache_layout or 'NHD'}")
    return fields


def rank_namespaces(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                    cfg: ConnectorConfig) -> Dict[tuple, str]:
    """(tp_rank, pp_rank) -> namespace, for every rank of this engine."""
    spec = _group_spec(kv_cache_config, vllm_config)
    par = vllm_config.parallel_config
    tp, pp = par.tensor_parallel_size, par.pipeline_parallel_size
    model = cfg.model_id or vllm_config.model_config.model
    # A model of Mamba groups only: its state dtypes are in the layout fingerprint.
    dtype = str(spec.dtype).replace("torch.", "") if hasattr(spec, "dtype") else "state"
    fp = layout_fingerprint(layout_parts(kv_cache_config))
    return {
        (t, p): namespace(model, dtype, spec.block_size, fp, t, tp, p, pp)
        for p in range(pp)
        for t in range(tp)
    }


def rank_layers(vllm_config: "VllmConfig", layers: List[str], pp_rank: int) -> List[str]:
    """The layers of `layers` that a rank of pipeline stage `pp_rank` holds."""
    pp = vllm_config.parallel_config.pipeline_parallel_size
    if pp <= 1:
        return list(layers)
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.utils import extract_layer_index

    total = vllm_config.model_config.get_total_num_hidden_layers()
    start, end = get_pp_indices(total, pp_rank, pp)
    return [n for n in layers if start <= extract_layer_index(n) < end]


def rank_group_slot_bytes(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
                          pp_rank: int) -> List[List[int]]:
    """Per KV cache group, the slot sizes of one block on a rank of pipeline
    stage `pp_rank`, as the worker registers them (orbitkv.vllm.layout): a K
    and a V slot per layer, one slot per layer for MLA, one per state (conv,
    SSM) per Mamba layer. Every instance of a namespace must agree."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    _group_spec(kv_cache_config)
    out = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        layers = rank_layers(vllm_config, list(group.layer_names), pp_rank)
        page = spec.page_size_bytes
        if _is_mamba(spec):
            out.append(mamba_state_bytes(spec) * len(layers))
        elif isinstance(spec, MLAAttentionSpec):
            out.append([page] * len(layers))
        else:
            out.append([page // 2] * (2 * len(layers)))
    return out


def rank_description(kv_cache_config: "KVCacheConfig", group_slot_bytes: List[List[int]],
                     block_size: int) -> Optional[ModelDescription]:
    """The model description a hybrid KV cache registers with on one rank (its
    groups' bytes those of the rank's layers); None for one attention group."""
    if not is_hybrid(kv_cache_config):
        return None
    d = from_vllm_kv_cache_config(kv_cache_config, key_block_tokens=block_size)
    for g, sizes in zip(d.groups, group_slot_bytes):
        g.bytes = sum(sizes)
    d.validate()
    return d


def is_hybrid(kv_cache_config: "KVCacheConfig") -> bool:
    """Whether the KV cache registers with a model description: several KV
    cache groups, or any Mamba group (its blocks are states, not positions)."""
    groups = kv_cache_config.kv_cache_groups
    return len(groups) > 1 or any(_is_mamba(g.kv_cache_spec) for g in groups)


def _this_rank() -> tuple:
    """(tp_rank, pp_rank) of this worker; (0, 0) without vLLM's distributed groups."""
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 0
    return ps.get_tensor_model_parallel_rank(), ps.get_pp_group().rank_in_group


class OrbitKVConnector(KVConnectorBase_V1, SupportsHMA):
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
        spec = _group_spec(kv_cache_config, vllm_config)
        self._block_size = spec.block_size
        self._namespaces = rank_namespaces(vllm_config, kv_cache_config, self._cfg)
        self._hybrid = is_hybrid(kv_cache_config)
        self._mamba_groups = {i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                              if _is_mamba(g.kv_cache_spec)}
        if self._hybrid and self._cfg.load_policy == "sync":
            raise ValueError(
                "OrbitKVConnector: load_policy 'sync' with several KV cache groups: vLLM's hybrid "
                "scheduler recovers failed loads of async loads only (use 'async')")
        if self._cfg.start_manager:
            launch.ensure_manager(self._cfg)
        self._sched: Optional[SchedulerCore] = None
        self._worker: Optional[WorkerCore] = None
        slots = {p: rank_group_slot_bytes(vllm_config, kv_cache_config, p)
                 for p in {k[1] for k in self._namespaces}}
        descriptions = {p: rank_description(kv_cache_config, b, self._block_size)
                        for p, b in slots.items()}
        if role == KVConnectorRole.SCHEDULER:
            # One description per pipeline stage: stages of a hybrid model hold
            # different layers, so only one stage's probes would register.
            if self._hybrid and len(slots) > 1:
                raise ValueError("OrbitKVConnector: several KV cache groups with pipeline "
                                 "parallelism are not supported yet")
            self._sched = SchedulerCore(
                self._cfg,
                [
                    (self._namespaces[k], slots[k[1]] if self._hybrid else
                     [b for g in slots[k[1]] for b in g])
                    for k in sorted(self._namespaces)
                ],
                self._block_size,
                hash_block_size=kv_cache_config.hash_block_size,
                description=descriptions[0],
            )
        else:
            tp_rank, pp_rank = _this_rank()
            self._group_slot_bytes = slots[pp_rank]
            ns = self._namespaces[(tp_rank, pp_rank)]
            rank = pp_rank * vllm_config.parallel_config.tensor_parallel_size + tp_rank
            self._worker = WorkerCore(self._cfg, ns, rank, description=descriptions[pp_rank])

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
                request.request_id, blocks.get_block_ids(), num_external_tokens
            )

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._sched is not None
        so = scheduler_output
        cached = so.scheduled_cached_reqs
        new_reqs = [(r.req_id, r.block_ids, r.num_computed_tokens) for r in so.scheduled_new_reqs]
        cached_reqs = [
            (
                req_id,
                cached.new_block_ids[i],
                req_id in cached.resumed_req_ids,
                cached.num_computed_tokens[i],
            )
            for i, req_id in enumerate(cached.req_ids)
        ]
        spec = {r: len(t) for r, t in (so.scheduled_spec_decode_tokens or {}).items()}
        # Mamba 'align' states: exact (group, block, boundary) hand-offs, never
        # positional (vLLM nulls and relocates a Mamba group's blocks).
        state = so.kv_connector_block_state
        offers = dict(state.boundary_state_offloads) if state is not None else {}
        plan = self._sched.build_plan(
            new_reqs, cached_reqs, dict(so.num_scheduled_tokens), spec,
            set(so.preempted_req_ids or ()), state_offers=offers,
        )
        return OrbitKVConnectorMetadata(plan)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        assert self._sched is not None
        self._sched.on_output(
            set(connector_output.finished_recving or ()),
            set(connector_output.invalid_block_ids or ()),
            set(connector_output.failed_recving or ()),
        )

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        if self._sched is not None:
            self._sched.null_block = gpu_block_pool.null_block.block_id

    def request_finished(self, request: "Request", block_ids: List[int]) -> tuple:
        assert self._sched is not None
        return self._sched.request_finished(request.request_id), None

    def request_finished_all_groups(self, request: "Request", block_ids: tuple) -> tuple:
        """SupportsHMA: the request's blocks stay until its saves are done (every group)."""
        assert self._sched is not None
        return self._sched.request_finished(request.request_id), None

    # ---- worker side -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        groups = states = None
        if self._hybrid:
            kv_groups = self._kv_cache_config.kv_cache_groups
            groups = {n: g for g, group in enumerate(kv_groups) for n in group.layer_names}
            kv_caches = {n: t for n, t in kv_caches.items() if n in groups}
            states = {g: mamba_state_bytes(kv_groups[g].kv_cache_spec) for g in self._mamba_groups}
        layout = describe_kv_caches(kv_caches, self._kv_cache_config.num_blocks, groups, states)
        got = layout.group_slot_bytes()
        if not self._hybrid:
            got = [[b for g in got for b in g]]
        want = self._group_slot_bytes if self._hybrid else [
            [b for g in self._group_slot_bytes for b in g]]
        if got != want:
            raise ValueError(
                f"OrbitKVConnector: the KV tensors give {[len(g) for g in got]} slots per block "
                f"per group ({sorted({b for g in got for b in g})} bytes), the KV cache config "
                f"{[len(g) for g in want]} ({sorted({b for g in want for b in g})} bytes)"
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

    def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        sending, recving = set(sending or ()), set(recving or ())
        assert self._worker is not None
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving,
                                          failed_recving=self._worker.take_failed_loads(recving))

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
