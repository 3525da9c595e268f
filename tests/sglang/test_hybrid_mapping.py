"""orbitkv.hybrid.from_sglang_pools with SGLang 0.5.23's real HiCache v2 types:
PoolName, PoolHitPolicy and PoolTransfer, and page sizes read from real
MHATokenToKVPoolHost pools on CPU. kv (ALL_PAGES) is full attention, swa
(TRAILING_PAGES over N pages) a window of N pages, mamba (TRAILING_PAGES) a
checkpoint at every page; BLOCK_GROUPS is refused. No Manager needed.
"""

from __future__ import annotations

import pytest
from conftest import make_pool
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

from orbitkv.hybrid import GroupKind, SGLangPool, from_sglang_pools, sglang_page_bytes


def test_kv_swa_mamba_pools():
    kv = make_pool("page_first", layers=3, page_size=4)
    swa = make_pool("layer_first", layers=2, page_size=4)
    keys = [f"h{i}" for i in range(8)]
    # What the adapter's batch_exists_v2 is handed: the trailing window as keys.
    swa_lookup = PoolTransfer(name=PoolName.SWA, keys=keys[5:],
                              hit_policy=PoolHitPolicy.TRAILING_PAGES)
    pools = [
        SGLangPool(PoolName.KV, PoolHitPolicy.ALL_PAGES, sglang_page_bytes(kv)),
        SGLangPool.from_transfer(swa_lookup, sglang_page_bytes(swa)),
        SGLangPool(PoolName.MAMBA, PoolHitPolicy.TRAILING_PAGES, 37 << 20),
    ]
    d = from_sglang_pools(pools, page_size=kv.page_size)
    assert d.key_block_tokens == 4
    k, w, m = d.groups
    # Page bytes: layers x (K and V) x page tokens x heads x head_dim x bf16.
    assert (k.name, k.kind, k.storage_group, k.bytes) == (
        "kv", GroupKind.FULL_ATTENTION, 0, 3 * 2 * 4 * 2 * 8 * 2)
    assert (w.name, w.kind, w.window_tokens, w.bytes) == (
        "swa", GroupKind.SLIDING_WINDOW, 3 * 4, 2 * 2 * 4 * 2 * 8 * 2)
    assert (m.name, m.kind, m.checkpoint_interval_tokens, m.bytes) == (
        "mamba", GroupKind.RECURRENT, 4, 37 << 20)
    # The window covers exactly the pages the adapter's TRAILING_PAGES rule reads.
    assert -(-w.window_tokens // w.block_tokens) == len(swa_lookup.keys)
    d.validate()


def test_explicit_recurrent_and_indexer_pools():
    d = from_sglang_pools([
        SGLangPool(PoolName.KV, PoolHitPolicy.ALL_PAGES, 4096),
        SGLangPool(PoolName.INDEXER, PoolHitPolicy.ALL_PAGES, 512),
        SGLangPool("gdn_state", PoolHitPolicy.TRAILING_PAGES, 1 << 20, recurrent=True),
    ], page_size=64)
    assert [g.kind for g in d.groups] == [GroupKind.FULL_ATTENTION, GroupKind.FULL_ATTENTION,
                                          GroupKind.RECURRENT]
    assert d.groups[2].checkpoint_interval_tokens == 64


def test_refusals():
    with pytest.raises(ValueError, match="hit policy 'block_groups' has no OrbitKV mapping"):
        from_sglang_pools([SGLangPool(PoolName.KV, PoolHitPolicy.BLOCK_GROUPS, 4096)], 16)
    with pytest.raises(ValueError, match="trailing_pages 0"):
        from_sglang_pools([SGLangPool(PoolName.SWA, PoolHitPolicy.TRAILING_PAGES, 4096,
                                      trailing_pages=0)], 16)
    with pytest.raises(ValueError, match=r'groups\[1\]\.name: "kv" names two groups'):
        from_sglang_pools([SGLangPool(PoolName.KV, PoolHitPolicy.ALL_PAGES, 4096),
                           SGLangPool("kv", PoolHitPolicy.ALL_PAGES, 4096)], 16)
    with pytest.raises(ValueError, match=r"groups\[0\]\.bytes: 0"):
        from_sglang_pools([SGLangPool(PoolName.KV, PoolHitPolicy.ALL_PAGES, 0)], 16)
