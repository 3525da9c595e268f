"""A vLLM engine loop without a model: vLLM's real Scheduler with OrbitKVConnector
loaded by module path, a worker-side OrbitKVConnector over host KV tensors,
and a stand-in forward (kvreplay.write_rows) in between.

Like vLLM's own connector unit tests, the configuration is built directly
(VllmConfig from a tiny local model config, no download, no tokenizer), the
scheduler gets a KVCacheConfig with one full-attention group (or a hybrid one:
full attention + sliding window, or full attention + Mamba), and each step
feeds the scheduler a ModelRunnerOutput whose KVConnectorOutput comes from the
worker connector. Every step checks the KV rows of every running request
against what the forward would have written, so a wrong restored byte fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
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
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import kvreplay  # noqa: E402
import orbitkv  # noqa: E402
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


def extra(manager, **kw) -> dict:
    """kv_connector_extra_config for a test Manager (short bounds)."""
    cfg = {"socket_path": manager.socket_path, "retry_interval_s": 0.2, "query_timeout_ms": 300,
           "model_id": "tiny-llama"}
    cfg.update(kw)
    return cfg


def prompt(seed: int, n: int) -> List[int]:
    return [(seed * 7919 + i * 31) % 900 + 50 for i in range(n)]


def vllm_config(model: str, extra: dict, max_batched: int = 256,
                failure_policy: str = "recompute", mamba: bool = False,
                prefix_caching: bool = True) -> VllmConfig:
    """`mamba`: Mamba prefix caching as vLLM runs it (mamba_cache_mode "align")."""
    mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", seed=0,
                     max_model_len=2048)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched,
                         max_model_len=2048, enable_chunked_prefill=True,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=prefix_caching, prefix_caching_hash_algo="sha256_cbor",
                     mamba_cache_mode="align" if mamba and prefix_caching else "none")
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


# A hybrid model with Mamba layers (Qwen3-Next-like: full attention layers 1
# and 3, GDN layers 0 and 2 with a conv and an SSM state of different dtypes).
# As vLLM's hybrid allocator does, a full-attention and a Mamba layer share one
# buffer of pages (the state padded to the attention page, page_size_padded).
MAMBA_GROUPS = [["model.layers.1.self_attn.attn", "model.layers.3.self_attn.attn"],
                ["model.layers.0.linear_attn", "model.layers.2.linear_attn"]]
MAMBA_LAYERS = sorted(n for g in MAMBA_GROUPS for n in g)
STATE_SHAPES = ((3, 32), (2, 8, 16))  # conv (bf16), SSM (fp32)
STATE_DTYPES = (torch.bfloat16, torch.float32)
STATE_BYTES = [3 * 32 * 2, 2 * 8 * 16 * 4]
PAGE_BYTES = 2 * BLOCK_SIZE * HEADS * HEAD_SIZE * 2  # one attention layer's K and V block


def mamba_spec(mode: str = "align", **kw) -> MambaSpec:
    return MambaSpec(block_size=BLOCK_SIZE, shapes=STATE_SHAPES, dtypes=STATE_DTYPES,
                     page_size_padded=PAGE_BYTES, mamba_cache_mode=mode, **kw)


def mamba_kv_cache_config(num_blocks: int, mode: str = "align", **kw) -> KVCacheConfig:
    """Full attention + Mamba (`mode`: the MambaSpec's mamba_cache_mode)."""
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(list(MAMBA_GROUPS[0]), FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=DTYPE)),
            KVCacheGroupSpec(list(MAMBA_GROUPS[1]), mamba_spec(mode, **kw))],
        hash_block_size=BLOCK_SIZE,
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
    `window` (vLLM's sliding_window) makes the hybrid model of HYBRID_GROUPS,
    `mamba` the one of MAMBA_GROUPS (its config needs vllm_config(mamba=True))."""

    def __init__(self, config: VllmConfig, num_blocks: int = 64, layout: str = "kv_first",
                 record: Optional[kvreplay.Recording] = None,
                 window: Optional[int] = None, mamba: bool = False) -> None:
        self.config = config
        if mamba:
            self.kv_config = mamba_kv_cache_config(num_blocks)
        elif window is not None:
            self.kv_config = hybrid_kv_cache_config(num_blocks, window)
        else:
            self.kv_config = kv_cache_config(num_blocks)
        config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=self.kv_config,
                                   log_stats=True,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK_SIZE)
        assert isinstance(self.scheduler.connector, OrbitKVConnector)
        self.worker = OrbitKVConnector(config, KVConnectorRole.WORKER, self.kv_config)
        self.spec = spec(num_blocks, layout)
        null = self.scheduler.kv_cache_manager.block_pool.null_block.block_id
        self.hybrid = mamba or window is not None
        if mamba:
            self.spec = dict(self.spec, layout="block_first")
            self.specs = [dict(self.spec, layers=list(MAMBA_GROUPS[0]), null_block=null,
                               layer_ids=[MAMBA_LAYERS.index(n) for n in MAMBA_GROUPS[0]]),
                          {"kind": "mamba", "num_blocks": num_blocks, "block_size": BLOCK_SIZE,
                           "layers": list(MAMBA_GROUPS[1]), "state_bytes": list(STATE_BYTES),
                           "layer_ids": [MAMBA_LAYERS.index(n) for n in MAMBA_GROUPS[1]],
                           "null_block": null}]
            self.kv = kvreplay.make_mamba_hybrid_caches(self.specs[0], self.specs[1],
                                                        PAGE_BYTES, "cpu", host_tensor)
        elif window is None:
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
            kvreplay.forward_groups(self.specs, self.kv, tokens, self.block_ids[req_id], start, end)
            ids = self.block_ids[req_id]
            recorded_writes.append({"req_id": req_id, "tokens": tokens[:end],
                                    "block_ids": [list(g) for g in ids] if self.hybrid
                                    else list(ids[0]),
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
            tokens = list(self.reqs[req_id].all_token_ids)
            if s.hybrid:  # every group's blocks, checked up to the plan's prefix
                checks.append({"req_id": req_id, "tokens": tokens,
                               "block_ids": [list(g) for g in s.group_block_ids],
                               "start": s.skip_blocks * BLOCK_SIZE, "end": s.prefix_tokens})
                continue
            ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            first = ids.index(s.block_ids[0])
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
            bad = kvreplay.check_groups(self.specs, self.kv, list(req.all_token_ids), groups, 0,
                                        req.num_computed_tokens)
            assert not bad, f"{req.request_id}: {len(bad)} wrong KV rows or states, first {bad[:3]}"

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


# ---- shared by the connector tests --------------------------------------------------


def hybrid_engine(manager, model_path, window: Optional[int] = None, mamba: bool = False,
                  num_blocks: int = 64, record=None, **kw) -> Engine:
    """An Engine of a hybrid model (HYBRID_GROUPS with `window`, or MAMBA_GROUPS)
    on `manager`, extra config `kw`."""
    return Engine(vllm_config(model_path, extra(manager, **kw), mamba=mamba), window=window,
                  mamba=mamba, num_blocks=num_blocks, record=record)


def group_bytes(e: Engine, g: int) -> int:
    """Bytes of one block (piece) of KV cache group `g` on e's worker."""
    return e.worker_core._layout.block_bytes(g)


class Gate:
    """Wraps a worker's orbitkv.Client: its load queries and/or publishes (of
    `publish_groups` only, when given) wait for open()."""

    def __init__(self, core, query=False, publish=False, publish_groups=None):
        self.event = threading.Event()
        self.entered = threading.Event()
        real_factory = core._client_factory
        gate = self

        class Gated:
            def __init__(self):
                self._c = real_factory()

            def __getattr__(self, name):
                return getattr(self._c, name)

            def query(self, *a, **kw):
                if query:
                    gate.entered.set()
                    gate.event.wait(30)
                return self._c.query(*a, **kw)

            def publish(self, inst, group, *a, **kw):
                if publish and (publish_groups is None or group in publish_groups):
                    gate.entered.set()
                    gate.event.wait(30)
                return self._c.publish(inst, group, *a, **kw)

        core._client_factory = Gated
        core._failed("test: reconnect through the gate")
        core._next_retry = 0.0

    def open(self):
        self.event.set()


def gated_load(e: Engine, seed: int, tokens: int):
    """Serves a prompt, then starts loading the same prompt as request "b" with
    the worker's load query held at a Gate; returns (b, gate) once it waits."""
    e.serve(request("a", prompt(seed, tokens)))
    gate = Gate(e.worker_core, query=True)
    b = e.add(request("b", prompt(seed, tokens)))
    e.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert gate.entered.wait(10)
    return b, gate


def flood_pool(m, block_bytes: int) -> None:
    """Publishes unrelated blocks (their own namespace) until the Manager's
    DRAM pool dropped everything else."""
    lay = orbitkv.page_first_layout(64, [block_bytes])
    pages = orbitkv.allocate_regions(lay)
    with orbitkv.Client(m.socket_path) as c:
        inst = c.register_instance("evict", 0, "host", lay, pages)
        for i in range(0, 1024, 64):
            keys = [hashlib.sha256(b"evict%d" % (i + j)).digest() for j in range(64)]
            c.publish(inst, 0, keys, list(range(64)))


def local_plus_manager_hit(e: Engine, seed: int):
    """vLLM's local cache holds 3 blocks of a prefix (request c), the Manager
    all 6 (request a, served before): request b of that prefix loads the rest.
    Returns (b's load spec, the bytes restored for it) once b finished."""
    e.serve(request("a", prompt(seed, 6 * BLOCK_SIZE + 1)))
    e.add(request("c", prompt(seed, 3 * BLOCK_SIZE + 1)))
    e.run()
    before = e.stats.get("restored_bytes", 0)
    b = e.add(request("b", prompt(seed, 6 * BLOCK_SIZE + 1)))
    load = e.step().plan.loads[0]
    assert load.skip_blocks == 3 and load.prefix_tokens == 6 * BLOCK_SIZE
    e.run()
    assert b.is_finished()
    return load, e.stats["restored_bytes"] - before


def preempt_while_loading(e: Engine, seed: int, steps: int = 150) -> List[Request]:
    """Request b loads a served prefix slowly (its query held) while c and d
    decode in a block budget too small for all: one is preempted (its saves in
    flight), then the load goes on. Returns [b, c, d], all finished."""
    e.serve(request("a", prompt(seed, 5 * BLOCK_SIZE)))
    gate = Gate(e.worker_core, query=True)
    b = e.add(request("b", prompt(seed, 5 * BLOCK_SIZE)))  # loads a's blocks (slowly)
    e.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    c = e.add(request("c", prompt(seed + 1, 6 * BLOCK_SIZE + 8), max_tokens=40))
    d = e.add(request("d", prompt(seed + 2, 2 * BLOCK_SIZE), max_tokens=60))
    preempted = set()
    for _ in range(steps):
        r = e.step()
        preempted |= set(r.so.preempted_req_ids or ())
        if preempted and not gate.event.is_set():
            gate.open()
        if not e.scheduler.requests:
            break
    gate.open()
    assert preempted, "the block budget should force a preemption"
    e.run()
    assert b.is_finished() and c.is_finished() and d.is_finished()
    return [b, c, d]


def run_failed_load(e: Engine, b: Request) -> List[str]:
    """Steps until `b` finished; returns the requests vLLM got as failed loads
    (failed_recving). Hybrid loads never fail by block id."""
    failed = []
    while not b.is_finished():
        r = e.step()
        failed += r.failed
        assert not r.invalid  # never block ids: vLLM's hybrid scheduler refuses them
    return failed


def abort_while_loading(e: Engine, seed: int) -> None:
    """Request b, loading (its query held), is aborted: vLLM keeps its blocks
    until the load ends, then everything is freed."""
    b, gate = gated_load(e, seed, 4 * BLOCK_SIZE + 1)
    free_before = e.free_blocks()
    e.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    for _ in range(3):
        e.step()
    assert e.free_blocks() == free_before  # the Manager is still writing into them
    gate.open()
    e.run(until=lambda: not e.scheduler.requests)
    e.assert_empty()
