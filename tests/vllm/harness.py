"""A vLLM engine loop without a model: vLLM's real Scheduler with OrbitKVConnector
loaded by module path, a worker-side OrbitKVConnector over host KV tensors,
and a stand-in forward (kvreplay.write_rows) in between.

Like vLLM's own connector unit tests, the configuration is built directly
(VllmConfig from a tiny local model config, no download, no tokenizer), the
scheduler gets a KVCacheConfig with one full-attention group, and each step
feeds the scheduler a ModelRunnerOutput whose KVConnectorOutput comes from the
worker connector. Every step checks the KV rows of every running request
against what the forward would have written, so a wrong restored byte fails.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Dict, List, Optional

os.environ.setdefault("PYTHONHASHSEED", "0")  # reproducible block hashes (keys) in every process

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvreplay  # noqa: E402
from orbitkv.vllm import OrbitKVConnector  # noqa: E402
from orbitkv.vllm.layout import host_tensor  # noqa: E402

EOS = 2
BLOCK_SIZE = 16
HEADS, HEAD_SIZE, DTYPE = 2, 16, torch.float16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": HEADS,
    "head_dim": HEAD_SIZE, "num_hidden_layers": len(LAYERS), "vocab_size": 1000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
    "bos_token_id": 1, "eos_token_id": EOS,
}

init_none_hash(sha256_cbor)


def model_dir(root: Path) -> str:
    d = root / "tiny-llama"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


def vllm_config(model: str, extra: dict, max_batched: int = 256,
                failure_policy: str = "recompute") -> VllmConfig:
    mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", seed=0,
                     max_model_len=2048)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched,
                         max_model_len=2048, enable_chunked_prefill=True,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=True, prefix_caching_hash_algo="sha256_cbor")
    kt = KVTransferConfig(kv_connector="OrbitKVConnector", kv_connector_module_path="orbitkv.vllm",
                          kv_role="kv_both", kv_connector_extra_config=dict(extra),
                          kv_load_failure_policy=failure_policy)
    return VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                      kv_transfer_config=kt, device_config=DeviceConfig("cpu"))


def kv_cache_config(num_blocks: int) -> KVCacheConfig:
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=DTYPE))],
    )
    cfg.kv_cache_layout = "NHD"
    return cfg


# A hybrid model (Gemma-like): full-attention layers 0 and 2, sliding-window
# layers 1 and 3; like vLLM's hybrid allocator, one KV tensor per layer pair
# (a full and a window layer), shared by both: a block id belongs to one group.
HYBRID_GROUPS = [["model.layers.0.self_attn.attn", "model.layers.2.self_attn.attn"],
                 ["model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"]]
HYBRID_LAYERS = sorted(n for g in HYBRID_GROUPS for n in g)


def hybrid_kv_cache_config(num_blocks: int, window: int) -> KVCacheConfig:
    """Full attention + a sliding window of `window` tokens (vLLM's sliding_window)."""
    kw = dict(block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=DTYPE)
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(HYBRID_GROUPS[0]), FullAttentionSpec(**kw)),
                         KVCacheGroupSpec(list(HYBRID_GROUPS[1]),
                                          SlidingWindowSpec(sliding_window=window, **kw))],
    )
    cfg.kv_cache_layout = "NHD"
    return cfg


def request(req_id: str, tokens: List[int], max_tokens: int = 4,
            cache_salt: Optional[str] = None) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sp.update_from_generation_config({}, EOS)
    return Request(request_id=req_id, prompt_token_ids=list(tokens), sampling_params=sp,
                   pooling_params=None, mm_features=None, cache_salt=cache_salt,
                   block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256_cbor))


def spec(num_blocks: int, layout: str) -> dict:
    return {"num_blocks": num_blocks, "block_size": BLOCK_SIZE, "num_kv_heads": HEADS,
            "head_size": HEAD_SIZE, "dtype": "float16", "layers": list(LAYERS), "layout": layout}


class Engine:
    """One vLLM instance: scheduler (+ its connector) and one worker connector.
    `window` (vLLM's sliding_window) makes the hybrid model of HYBRID_GROUPS."""

    def __init__(self, config: VllmConfig, num_blocks: int = 64, layout: str = "kv_first",
                 record: Optional[kvreplay.Recording] = None,
                 window: Optional[int] = None) -> None:
        self.config = config
        self.kv_config = (kv_cache_config(num_blocks) if window is None
                          else hybrid_kv_cache_config(num_blocks, window))
        config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=self.kv_config,
                                   log_stats=True,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK_SIZE)
        assert isinstance(self.scheduler.connector, OrbitKVConnector)
        self.worker = OrbitKVConnector(config, KVConnectorRole.WORKER, self.kv_config)
        self.spec = spec(num_blocks, layout)
        null = self.scheduler.kv_cache_manager.block_pool.null_block.block_id
        if window is None:
            self.specs = [self.spec]
            self.kv = kvreplay.make_kv_caches(self.spec, "cpu", host_tensor)
        else:
            # One tensor per (full, window) layer pair, seen by both layers.
            pairs = kvreplay.make_kv_caches(
                dict(self.spec, layers=[f"t{i}" for i in range(len(HYBRID_GROUPS[0]))]),
                "cpu", host_tensor)
            self.kv = {name: pairs[f"t{i}"] for g in HYBRID_GROUPS for i, name in enumerate(g)}
            self.specs = [dict(self.spec, layers=list(g), null_block=null,
                               layer_ids=[HYBRID_LAYERS.index(n) for n in g])
                          for g in HYBRID_GROUPS]
        self.worker.register_kv_caches(self.kv)
        self.block_ids: Dict[str, List[List[int]]] = {}
        self.reqs: Dict[str, Request] = {}
        self.record = record
        self.stats: Dict[str, int] = {}
        self.steps = 0
        self._pending: Dict[str, object] = {}  # recorded loads not yet finished

    @property
    def sched_core(self):
        return self.scheduler.connector._sched

    @property
    def worker_core(self):
        return self.worker._worker

    def add(self, req: Request) -> Request:
        self.reqs[req.request_id] = req
        self.scheduler.add_request(req)
        return req

    def step(self) -> "StepResult":
        so = self.scheduler.schedule()
        meta = so.kv_connector_metadata
        plan = meta.plan
        # vLLM's multiprocess executors pickle the scheduler output to the workers.
        assert pickle.loads(pickle.dumps(meta)).plan == plan
        # The forward: positions [computed, computed + scheduled) of every scheduled request.
        writes = []
        for r in so.scheduled_new_reqs:
            self.block_ids[r.req_id] = [list(g) for g in r.block_ids]
            writes.append((r.req_id, r.num_computed_tokens))
        c = so.scheduled_cached_reqs
        for i, req_id in enumerate(c.req_ids):
            new = c.new_block_ids[i]
            if req_id in c.resumed_req_ids:
                self.block_ids[req_id] = [list(g) for g in new]
            elif new is not None:
                for have, add in zip(self.block_ids[req_id], new):
                    have.extend(add)
            writes.append((req_id, c.num_computed_tokens[i]))
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        if so.has_sync_kv_loads:
            self.worker.start_load_kv(None)
        recorded_writes = []
        for req_id, start in writes:
            req = self.reqs[req_id]
            end = start + so.num_scheduled_tokens[req_id]
            tokens = list(req.all_token_ids)
            self.worker.wait_for_layer_load(LAYERS[0])
            for sp, ids in zip(self.specs, self.block_ids[req_id]):
                kvreplay.write_rows(sp, self.kv, tokens, ids, start, end)
            recorded_writes.append({"req_id": req_id, "tokens": tokens[:end],
                                    "block_ids": list(self.block_ids[req_id][0]),
                                    "start": start, "end": end})
        if not so.has_sync_kv_loads:
            self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        results = self.worker.get_transfer_results(so.finished_req_ids)
        sending, recving = results.finished_sending, results.finished_recving
        failed = results.failed_recving
        invalid = self.worker.get_block_ids_with_load_errors()
        wstats = self.worker.get_kv_connector_stats()
        self.worker.clear_connector_metadata()
        # Sample one token for every request whose prompt is complete after this step.
        req_ids, sampled = [], []
        for req_id, start in writes:
            req = self.reqs[req_id]
            end = start + so.num_scheduled_tokens[req_id]
            req_ids.append(req_id)
            sampled.append([100 + (sum(req.all_token_ids) + end) % 800] if end >= req.num_tokens else [])
        kv_out = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                   failed_recving=failed, invalid_block_ids=invalid,
                                   kv_connector_stats=wstats)
        out = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=None,
                                kv_connector_output=kv_out)
        engine_out = self.scheduler.update_from_output(so, out)
        # The connector's counters as vLLM reports them: worker and scheduler side summed.
        for eco in engine_out.values():
            st = eco.scheduler_stats
            for k, v in ((st.kv_connector_stats or {}) if st is not None else {}).items():
                self.stats[k] = self.stats.get(k, 0) + v
        if self.record is not None:
            checks = self._load_checks(plan, recving or set())
            self.record.step(plan.to_json(), recorded_writes, checks)
        self.steps += 1
        self.check_running()
        return StepResult(so, plan, sending or set(), recving or set(), invalid, engine_out,
                          failed)

    def _load_checks(self, plan, recving) -> List[dict]:
        """The rows each finished load brought, for the recording."""
        for s in plan.loads:
            self._pending[s.req_id] = s
        checks = []
        for req_id in recving:
            s = self._pending.pop(req_id, None)
            if s is None:
                continue
            ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            first = ids.index(s.block_ids[0])
            tokens = list(self.reqs[req_id].all_token_ids)
            checks.append({"req_id": req_id, "tokens": tokens, "block_ids": list(ids),
                           "start": first * BLOCK_SIZE,
                           "end": (first + len(s.block_ids)) * BLOCK_SIZE})
        return checks

    def check_running(self) -> None:
        """Every running request's computed KV rows are the forward's, byte for
        byte, in every group (a window group's blocks that vLLM still holds)."""
        for req in self.scheduler.running:
            if req.status != RequestStatus.RUNNING:
                continue
            groups = self.scheduler.kv_cache_manager.get_block_ids(req.request_id)
            for sp, ids in zip(self.specs, groups):
                n = min(req.num_computed_tokens, len(ids) * BLOCK_SIZE)
                bad = kvreplay.check_rows(sp, self.kv, list(req.all_token_ids), ids, 0, n)
                assert not bad, f"{req.request_id}: {len(bad)} wrong KV rows, first {bad[:3]}"

    def run(self, timeout_s: float = 60.0, until=None) -> None:
        """Steps until no request is left, delayed frees included (or `until()` holds);
        idle steps (everything waits for the Manager) sleep 1 ms."""
        deadline = time.monotonic() + timeout_s
        while True:
            if until() if until is not None else not self.scheduler.has_requests():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not done after {timeout_s} s: {self.describe()}")
            if self.step().so.total_num_scheduled_tokens == 0:
                time.sleep(0.001)

    def describe(self) -> str:
        return ", ".join(f"{r.request_id}:{r.status.name}" for r in self.scheduler.requests.values())

    def serve(self, req: Request) -> Request:
        """Runs `req` to the end (its saves done, its blocks freed), then drops
        vLLM's local prefix cache, so the same prefix must come from the Manager."""
        self.add(req)
        self.run()
        assert req.is_finished()
        assert self.scheduler.reset_prefix_cache()
        return req

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def assert_empty(self) -> None:
        s = self.scheduler
        assert not s.requests and not s.running and len(s.waiting) == 0, self.describe()
        assert self.free_blocks() == s.kv_cache_manager.block_pool.num_gpu_blocks - 1
        assert self.sched_core.tracked() == 0
        assert not self.worker_core.busy()

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.connector.shutdown()


class StepResult:
    def __init__(self, so, plan, sending, recving, invalid, engine_out, failed=()) -> None:
        self.so, self.plan, self.sending, self.recving = so, plan, sending, recving
        self.invalid, self.engine_out, self.failed = invalid, engine_out, set(failed)
