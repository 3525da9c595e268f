"""orbitkv.hybrid.from_vllm_kv_cache_config with vLLM 0.33's real KV cache specs
(vllm.v1.kv_cache_interface): full attention, sliding window and Mamba groups
become one storage group each, with the bytes vLLM allocates per block, the
window vLLM's own SlidingWindowManager requires, and a checkpoint per block;
what has no mapping is refused. No Manager needed.
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from orbitkv.hybrid import GroupKind, from_vllm_kv_cache_config


def attention(cls=FullAttentionSpec, **kw):
    return cls(block_size=kw.pop("block_size", 16), num_kv_heads=2, head_size=64,
               dtype=torch.bfloat16, **kw)


def mamba(mode="align", block_size=16):
    # A GDN-like layer: a conv state and a recurrent state.
    return MambaSpec(block_size=block_size, shapes=((3, 256), (4, 32, 32)),
                     dtypes=(torch.bfloat16, torch.float32), mamba_cache_mode=mode)


def config(*groups, hash_block_size=16):
    return KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layers, spec) for layers, spec in groups],
        hash_block_size=hash_block_size)


KV_PER_LAYER = 2 * 16 * 2 * 64 * 2  # K and V, 16 tokens, 2 heads of 64, bf16
MAMBA_PER_LAYER = 3 * 256 * 2 + 4 * 32 * 32 * 4


def test_qwen3_next_like_hybrid():
    d = from_vllm_kv_cache_config(config(
        (["model.layers.3.self_attn.attn", "model.layers.7.self_attn.attn"], attention()),
        (["model.layers.0.linear_attn", "model.layers.1.linear_attn", "model.layers.2.linear_attn"],
         mamba())))
    assert d.key_block_tokens == 16
    a, m = d.groups
    assert (a.kind, a.storage_group, a.block_tokens, a.bytes) == (
        GroupKind.FULL_ATTENTION, 0, 16, 2 * KV_PER_LAYER)
    assert (m.kind, m.storage_group, m.block_tokens, m.bytes, m.checkpoint_interval_tokens) == (
        GroupKind.RECURRENT, 1, 16, 3 * MAMBA_PER_LAYER, 16)
    assert a.bytes == attention().page_size_bytes * 2  # what vLLM allocates per block
    d.validate()


@pytest.mark.parametrize("sliding_window", [2, 17, 128, 4096])
def test_sliding_window_needs_what_vllm_needs(sliding_window):
    d = from_vllm_kv_cache_config(config(
        (["g.0"], attention()),
        (["l.1", "l.2"], attention(SlidingWindowSpec, sliding_window=sliding_window))))
    w = d.groups[1]
    assert w.kind == GroupKind.SLIDING_WINDOW and w.window_tokens == sliding_window - 1
    # The blocks a recovery reads before P are the ones vLLM's own hit rule demands.
    blocks = -(-w.window_tokens // w.block_tokens)
    assert blocks == SlidingWindowManager._contiguous_blocks_for_hit(sliding_window, 16, False)


def test_full_attention_that_records_a_window_stays_full():
    # The hybrid allocator off: vLLM keeps every block of such layers.
    d = from_vllm_kv_cache_config(config((["l"], attention(sliding_window=64))))
    assert d.groups[0].kind == GroupKind.FULL_ATTENTION


def test_mla_is_full_attention():
    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    d = from_vllm_kv_cache_config(config((["l"], spec)))
    assert d.groups[0].kind == GroupKind.FULL_ATTENTION
    assert d.groups[0].bytes == spec.page_size_bytes


def test_key_block_defaults_and_larger_group_blocks():
    d = from_vllm_kv_cache_config(config((["a"], attention(block_size=64)),
                                         (["m"], mamba(block_size=64)), hash_block_size=None))
    assert d.key_block_tokens == 64
    d = from_vllm_kv_cache_config(config((["a"], attention(block_size=64)),
                                         (["m"], mamba(block_size=64)), hash_block_size=16))
    assert d.key_block_tokens == 16 and d.groups[0].block_tokens == 64


def test_refusals():
    with pytest.raises(ValueError, match="mamba_cache_mode 'none'"):
        from_vllm_kv_cache_config(config((["m"], mamba("none"))))
    local = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                      dtype=torch.bfloat16, attention_chunk_size=256)
    with pytest.raises(ValueError, match="ChunkedLocalAttentionSpec has no OrbitKV mapping"):
        from_vllm_kv_cache_config(config((["l"], local)))
    with pytest.raises(ValueError, match="keeps no tokens"):
        from_vllm_kv_cache_config(config((["l"], attention(SlidingWindowSpec, sliding_window=1))))
    with pytest.raises(ValueError, match="no KV cache groups"):
        from_vllm_kv_cache_config(KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                                                kv_cache_groups=[]))
