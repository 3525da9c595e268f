"""orbitkv.transformers: a prefix cache for a transformers causal LM.

Before a prefill, :meth:`PrefixCache.prefill` asks the Manager for the longest
cached prefix of the prompt (whole 16-token blocks), restores it into a new
``transformers.DynamicCache`` on the model's device, runs the model only over
the remaining tokens (in chunks of ``chunk_tokens``) and publishes the new
complete blocks. A failed block restore (a corrupted SSD object, a Manager
that restarted) cuts the restored prefix there: those tokens are recomputed,
so the output is right either way, and the result says what happened (a
block that failed with Corruption is not read again by this cache)::

    import orbitkv, orbitkv.transformers as okt
    client = orbitkv.Client(socket_path)
    cache = okt.PrefixCache(model, client, num_pages=512)
    r = cache.prefill(input_ids)           # r.cache, r.logits, r.restored_tokens, r.timings
    tokens = okt.greedy(model, r.cache, r.logits, 64)

**Keys.** Block i's key is SHA-256 over block i-1's key (the namespace digest
for block 0) and the block's 16 token ids (little-endian int64), so a key
names the whole prefix up to its block. The namespace (also the Manager
namespace) is ``transformers/<model name>/<config hash>/<dtype>/devices=<n>``,
the config hash being SHA-256 of the model config as sorted JSON: another
model, dtype, config or device count never matches.

**Memory.** The Manager restores into and publishes from a page pool of
``num_pages`` pages registered through :mod:`orbitkv.torch` (CUDA tensors for a
model on a GPU, :func:`orbitkv.torch.host_tensors` for one on the CPU): per
layer ``[num_pages, 2, kv_heads, 16, head_dim]`` (one slot per layer holding
its K and V block). Prefixes longer than the pool go in several rounds.
Restored blocks are gathered into the cache's ``[1, kv_heads, tokens,
head_dim]`` tensors; new blocks are copied out of them before publishing.

Supported: batch size 1, decoder-only models whose every layer is full
attention with a ``DynamicCache`` of ``layers[i].keys`` / ``.values`` (Llama,
Qwen2/Qwen3, Mistral without a sliding window); anything else is refused with
the reason.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from transformers import DynamicCache

from . import torch as orbitkv_torch
from ._chain import take_prefix
from ._orbitkv import Client, NotFoundError

__all__ = ["BLOCK_TOKENS", "PrefixCache", "PrefillResult", "block_keys", "greedy", "namespace"]

BLOCK_TOKENS = 16


def _config_hash(config) -> str:
    d = config.to_dict()
    d.pop("transformers_version", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def namespace(model, device_count: Optional[int] = None) -> str:
    """The namespace of `model`'s KV: model name, config hash, dtype, devices."""
    config = model.config
    name = getattr(config, "_name_or_path", "") or type(model).__name__
    if device_count is None:
        device_count = len({p.device for p in model.parameters()})
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return f"transformers/{name}/{_config_hash(config)}/{dtype}/devices={device_count}"


def block_keys(ns: str, token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> List[bytes]:
    """Chained SHA-256 keys of the whole blocks of `token_ids` under `ns`."""
    prev = hashlib.sha256(ns.encode()).digest()
    out = []
    ids = [int(t) for t in token_ids]
    for b in range(len(ids) // block_tokens):
        h = hashlib.sha256(prev)
        block = ids[b * block_tokens : (b + 1) * block_tokens]
        h.update(b"".join(t.to_bytes(8, "little", signed=True) for t in block))
        prev = h.digest()
        out.append(prev)
    return out


@dataclass
class PrefillResult:
    """cache: the DynamicCache over the whole prompt; logits: the last
    position's logits [1, vocab] (float32); restored_tokens / computed_tokens;
    sources: blocks restored per tier ('dram', 'ssd'); errors: (block index in
    the prompt's chain, code, message) of blocks whose restore failed (recomputed); published: blocks
    newly stored; budget_continuations: queries that followed one cut by the
    Manager's query byte budget; timings (seconds): query, restore
    (Manager copies and the gather into the cache), compute, publish, total."""

    cache: DynamicCache
    logits: torch.Tensor
    restored_tokens: int
    computed_tokens: int
    sources: Dict[str, int] = field(default_factory=dict)
    errors: List[tuple] = field(default_factory=list)
    published: int = 0
    restored_bytes: int = 0
    budget_continuations: int = 0
    timings: Dict[str, float] = field(default_factory=dict)


def _attention_shape(config):
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"orbitkv.transformers supports full-attention layers only, this model has "
            f"{sorted(set(layer_types))}"
        )
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        if not layer_types:
            raise ValueError("orbitkv.transformers does not support sliding-window attention")
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads, head_dim


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PrefixCache:
    """A prefix cache for `model` through the Manager behind `client`.

    num_pages: pages in the registered pool (one 16-token block each);
    chunk_tokens: prefill chunk (the same chunking from the first computed
    token on, whatever was restored); rank: the instance's rank;
    ttl_ms: query lease time; storage_codec: the namespace's SSD storage
    codec ("" = the Manager's --storage-codec; none, ans, fp8, turboquant-4,
    turboquant-3: the lossy ones need a bf16/fp16 model), with the model's
    head_dim and dtype. The Manager keeps a fresh publish raw in DRAM and
    encodes the SSD copy, so a restore from SSD of a lossy codec gives the
    decoded (approximate) KV."""

    def __init__(
        self,
        model,
        client: Client,
        *,
        num_pages: int = 256,
        chunk_tokens: int = 512,
        rank: int = 0,
        ttl_ms: int = 30000,
        ns: Optional[str] = None,
        storage_codec: str = "",
    ):
        self.model = model
        self.client = client
        self.chunk_tokens = int(chunk_tokens)
        self.ttl_ms = ttl_ms
        self.ns = ns or namespace(model)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.layers, self.kv_heads, self.head_dim = _attention_shape(model.config)
        shape = (num_pages, 2, self.kv_heads, BLOCK_TOKENS, self.head_dim)
        if self.device.type == "cuda":
            self.pages = [
                torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)
            ]
        elif self.device.type == "cpu":
            self.pages = orbitkv_torch.host_tensors(shape, self.dtype, count=self.layers)
        else:
            raise ValueError(f"model on {self.device}: only cuda:N and cpu are supported")
        self.reg = orbitkv_torch.register_tensors(client, self.ns, rank, self.pages, page_dim=0,
                                                  storage_codec=storage_codec,
                                                  head_dim=self.head_dim)
        self.num_pages = num_pages
        self.block_bytes = self.reg.page_bytes
        # Keys whose restore failed with Corruption: later prefills stop their
        # restorable prefix before them instead of reading them again (the
        # Manager keeps a damaged object until the ring reuses its space).
        self.bad_keys: "set[bytes]" = set()

    def close(self) -> None:
        self.reg.unregister()

    def __enter__(self) -> "PrefixCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- cache object <-> pages

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def _check_layer(self, cache: DynamicCache, l: int, tokens: int) -> None:
        k = cache.layers[l].keys
        want = (1, self.kv_heads, tokens, self.head_dim)
        if tuple(k.shape) != want:
            raise ValueError(f"cache layer {l} keys are {tuple(k.shape)}, expected {want}")

    def _fill_cache(self, cache: DynamicCache, ks, vs) -> None:
        for l in range(self.layers):
            cache.update(ks[l], vs[l], l)

    # -- the steps

    def query(self, keys: List[bytes]):
        return self.reg.query(keys, self.ttl_ms)

    def _restore(self, q, keys: List[bytes], blocks: int, result: PrefillResult, ks, vs, base: int):
        """Restores blocks [0, blocks) of query q, whose keys are keys[base:],
        into tokens [base*16, ...) of the per-layer K and V tensors ks, vs
        [1, H, T, D]. Returns how many blocks it restored (cut at the first
        failed block)."""
        done = 0
        while done < blocks:
            n = min(self.num_pages, blocks - done)
            res = self.reg.restore(q.query, list(range(done, done + n)), list(range(n)))
            good = 0
            for r in res:
                if not r.ok:
                    result.errors.append((base + r.block, r.code, r.error))
                    if r.code == "Corruption" and len(self.bad_keys) < 65536:
                        self.bad_keys.add(keys[base + r.block])
                    break
                result.sources[r.source] = result.sources.get(r.source, 0) + 1
                good += 1
            if good:
                lo, hi = (base + done) * BLOCK_TOKENS, (base + done + good) * BLOCK_TOKENS
                for l in range(self.layers):
                    page = self.pages[l][:good]  # [n, 2, H, 16, D]
                    ks[l][0, :, lo:hi].copy_(page[:, 0].transpose(0, 1).reshape(self.kv_heads, -1, self.head_dim))
                    vs[l][0, :, lo:hi].copy_(page[:, 1].transpose(0, 1).reshape(self.kv_heads, -1, self.head_dim))
            done += good
            if good < n:
                break
        if done < blocks:
            # Blocks past the failed round still hold leases: release them now
            # (NotFound: that round took the query's last blocks).
            try:
                self.reg.release_query(q.query)
            except NotFoundError:
                pass
        result.restored_bytes += done * self.block_bytes
        return done

    def _restore_prefix(self, keys: List[bytes], restorable: int, cache: DynamicCache,
                        result: PrefillResult) -> int:
        """Queries and restores the longest cached prefix of keys[:restorable]
        into `cache`; returns its length in blocks. A query cut by the Manager's
        query byte budget (budget_limited: a prefix larger than the budget, by
        default the DRAM pool) is followed, once its blocks are restored, by a
        query for the rest of the chain (orbitkv._chain.take_prefix)."""
        T = restorable * BLOCK_TOKENS
        ks: List[torch.Tensor] = []
        vs: List[torch.Tensor] = []
        spent = {"query": 0.0, "restore": 0.0}

        def query(rest):
            t = time.perf_counter()
            try:
                return self.query(list(rest))
            finally:
                spent["query"] += time.perf_counter() - t

        def take(q, base: int) -> int:
            t = time.perf_counter()
            if not ks:
                ks.extend(torch.empty((1, self.kv_heads, T, self.head_dim), dtype=self.dtype,
                                      device=self.device) for _ in range(self.layers))
                vs.extend(torch.empty_like(k) for k in ks)
            try:
                return self._restore(q, keys, q.prefix, result, ks, vs, base)
            finally:
                spent["restore"] += time.perf_counter() - t

        walk = take_prefix(keys[:restorable], query, take)
        result.budget_continuations += walk.continuations
        done = walk.blocks
        t = time.perf_counter()
        if done:
            cut = done * BLOCK_TOKENS
            self._fill_cache(cache, [k[:, :, :cut] for k in ks], [v[:, :, :cut] for v in vs])
        _sync(self.device)
        result.timings["query"] = spent["query"]
        result.timings["restore"] = spent["restore"] + time.perf_counter() - t
        return done

    def extend(self, cache: DynamicCache, token_ids: Sequence[int]) -> torch.Tensor:
        """Runs the model over `token_ids` after what `cache` holds, in chunks of
        chunk_tokens; returns the last position's logits [1, vocab] (float32)."""
        ids = torch.as_tensor([int(t) for t in token_ids], dtype=torch.long, device=self.device)
        if ids.numel() == 0:
            raise ValueError("extend: no tokens")
        logits = None
        with torch.no_grad():
            for s in range(0, ids.numel(), self.chunk_tokens):
                chunk = ids[s : s + self.chunk_tokens][None]
                out = self.model(
                    input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=1
                )
                logits = out.logits[:, -1].float()
        return logits

    def publish(self, cache: DynamicCache, token_ids: Sequence[int], first_block: int = 0) -> int:
        """Publishes the complete blocks from `first_block` on of `cache`, which
        holds `token_ids`. Returns how many the Manager newly stored."""
        keys = block_keys(self.ns, token_ids)
        tokens = len(token_ids)
        for l in range(self.layers):
            self._check_layer(cache, l, tokens)
        stored = 0
        b = first_block
        with torch.no_grad():
            while b < len(keys):
                n = min(self.num_pages, len(keys) - b)
                lo, hi = b * BLOCK_TOKENS, (b + n) * BLOCK_TOKENS
                for l in range(self.layers):
                    layer = cache.layers[l]
                    for kv, src in ((0, layer.keys), (1, layer.values)):
                        blk = src[0, :, lo:hi].reshape(self.kv_heads, n, BLOCK_TOKENS, self.head_dim)
                        self.pages[l][:n, kv].copy_(blk.transpose(0, 1))
                r = self.reg.publish(keys[b : b + n], list(range(n)))
                stored += int(r.stored)
                b += n
        return stored

    def prefill(
        self, token_ids: Sequence[int], *, restore: bool = True, publish: bool = True
    ) -> PrefillResult:
        """Restores the longest cached prefix, computes the rest, publishes the
        new complete blocks. At least the last token is always computed (its
        logits are the result)."""
        ids = [int(t) for t in (token_ids.flatten().tolist() if torch.is_tensor(token_ids) else token_ids)]
        if not ids:
            raise ValueError("prefill: no tokens")
        t_start = time.perf_counter()
        keys = block_keys(self.ns, ids)
        cache = self.new_cache()
        result = PrefillResult(cache=cache, logits=torch.empty(0), restored_tokens=0, computed_tokens=0)
        restorable = (len(ids) - 1) // BLOCK_TOKENS
        if self.bad_keys:
            restorable = next((b for b in range(restorable) if keys[b] in self.bad_keys), restorable)
        restored_blocks = 0
        t = time.perf_counter()
        if restore and restorable > 0:
            restored_blocks = self._restore_prefix(keys, restorable, cache, result)
        result.restored_tokens = restored_blocks * BLOCK_TOKENS
        t = time.perf_counter()
        result.logits = self.extend(cache, ids[result.restored_tokens :])
        _sync(self.device)
        result.timings["compute"] = time.perf_counter() - t
        result.computed_tokens = len(ids) - result.restored_tokens
        if publish:
            t = time.perf_counter()
            result.published = self.publish(cache, ids, first_block=restored_blocks)
            result.timings["publish"] = time.perf_counter() - t
        result.timings["total"] = time.perf_counter() - t_start
        return result


def clone_cache(cache: DynamicCache, config) -> DynamicCache:
    """A new DynamicCache holding copies of `cache`'s tensors (same bytes)."""
    out = DynamicCache(config=config)
    for l, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), l)
    return out


def greedy(model, cache: DynamicCache, logits: torch.Tensor, steps: int) -> List[int]:
    """`steps` greedy tokens after a prefill whose last logits are `logits`
    (argmax, one token per forward, extending `cache`)."""
    device = next(model.parameters()).device
    out = []
    nxt = int(torch.argmax(logits[0]).item())
    with torch.no_grad():
        for i in range(steps):
            out.append(nxt)
            if i + 1 == steps:
                break
            o = model(
                input_ids=torch.tensor([[nxt]], device=device),
                past_key_values=cache,
                use_cache=True,
            )
            nxt = int(torch.argmax(o.logits[0, -1]).item())
    return out
