"""orbitkv.sglang.OrbitKVStorage against SGLang's real storage interface, its MHA
host pool on CPU memory, and a real orbitkv-cache-manager."""

from __future__ import annotations

import fcntl
import os
import signal
import time

import pytest
import torch
from conftest import LAYOUTS, Manager, make_pool, storage_config
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import orbitkv
import orbitkv.sglang
from orbitkv.sglang import OrbitKVStorage, page_key, pool_namespace


def page_bytes(pool, token_index: int) -> bytes:
    return bytes(pool.get_data_page(token_index, flat=True).view(torch.uint8).numpy())


def indices(pages, page_size: int) -> torch.Tensor:
    """Host token indices of whole pages."""
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])


def keys(n: int, tag: str = "k") -> list[str]:
    return [f"{tag}{i:03d}" + "0" * 60 for i in range(n)]


def attach(manager, pool, **kw) -> OrbitKVStorage:
    """What SGLang's cache controller does: the factory, then the pool."""
    cfg = storage_config(manager, page_first=pool.layout != "layer_first", **kw)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    return backend


def test_dynamic_factory_builds_the_backend(sglang_manager):
    pool = make_pool("layer_first")
    backend = attach(sglang_manager, pool)
    try:
        assert isinstance(backend, OrbitKVStorage)
        assert isinstance(backend, HiCacheStorage)
        assert orbitkv.sglang.SGLANG_VERSION == "0.5.23"
    finally:
        backend.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_is_byte_exact(sglang_manager, layout):
    src = make_pool(layout)
    ps = src.page_size
    ks = keys(6, layout)
    writer = attach(sglang_manager, src)
    expected = [page_bytes(src, p * ps) for p in range(1, 7)]
    assert writer.batch_set_v1(ks, indices(range(1, 7), ps)) == [True] * 6
    assert writer.batch_exists(ks) == 6

    # Another engine (its own pool, its own connection) restores into other pages.
    dst = make_pool(layout)
    reader = attach(sglang_manager, dst)
    try:
        targets = [9, 3, 12, 5, 7, 10]
        assert reader.batch_get_v1(ks, indices(targets, ps)) == [True] * 6
        for want, p in zip(expected, targets):
            assert page_bytes(dst, p * ps) == want
    finally:
        reader.close()
        writer.close()


def test_longest_prefix_answers(sglang_manager):
    pool = make_pool("page_first")
    ps = pool.page_size
    backend = attach(sglang_manager, pool)
    try:
        a, b, c, x = keys(4, "p")
        assert backend.batch_exists([a, b, c]) == 0
        assert backend.batch_exists([]) == 0
        assert backend.batch_set_v1([a, b, c], indices([1, 2, 3], ps)) == [True] * 3
        assert backend.batch_exists([a, b, c]) == 3
        assert backend.batch_exists([a, b, x, c]) == 2
        assert backend.batch_exists([x, a]) == 0
        untouched = [page_bytes(pool, p * ps) for p in (6, 7)]
        assert backend.batch_get_v1([a, b, x, c], indices([4, 5, 6, 7], ps)) == [
            True, True, False, False]
        assert page_bytes(pool, 4 * ps) == page_bytes(pool, 1 * ps)
        assert page_bytes(pool, 5 * ps) == page_bytes(pool, 2 * ps)
        assert [page_bytes(pool, p * ps) for p in (6, 7)] == untouched
    finally:
        backend.close()


def test_batches_larger_than_staging_go_through_in_chunks(sglang_manager):
    src = make_pool("layer_first", device_tokens=128)
    ps = src.page_size
    one_page = src.get_dummy_flat_data_page().numel() * 2
    writer = attach(sglang_manager, src, staging_bytes=2 * one_page)
    ks = keys(7, "chunk")
    expected = [page_bytes(src, p * ps) for p in range(7)]
    assert writer.batch_set_v1(ks, indices(range(7), ps)) == [True] * 7
    dst = make_pool("layer_first", device_tokens=128)
    reader = attach(sglang_manager, dst, staging_bytes=3 * one_page)
    try:
        assert reader.batch_get_v1(ks, indices(range(10, 17), ps)) == [True] * 7
        assert [page_bytes(dst, p * ps) for p in range(10, 17)] == expected
    finally:
        reader.close()
        writer.close()


def test_single_key_methods_share_the_page_format(sglang_manager):
    pool = make_pool("layer_first")
    ps = pool.page_size
    backend = attach(sglang_manager, pool)
    try:
        k1, k2, missing = keys(3, "single")
        assert backend.set(k1, pool.get_data_page(2 * ps, flat=True))
        assert backend.exists(k1) and not backend.exists(missing)
        assert backend.get(missing) is None
        got = backend.get(k1, pool.get_dummy_flat_data_page())
        assert bytes(got.view(torch.uint8).numpy()) == page_bytes(pool, 2 * ps)
        # A page stored by batch_set_v1 reads back through get, and the reverse.
        assert backend.batch_set_v1([k2], indices([3], ps)) == [True]
        assert bytes(backend.get(k2).view(torch.uint8).numpy()) == page_bytes(pool, 3 * ps)
        assert backend.batch_get_v1([k1], indices([6], ps)) == [True]
        assert page_bytes(pool, 6 * ps) == page_bytes(pool, 2 * ps)
        assert backend.batch_get([k1, missing])[1] is None
        with pytest.raises(ValueError):
            backend.set(k1, torch.zeros(3, dtype=torch.bfloat16))
    finally:
        backend.close()


def test_tp_ranks_layouts_and_models_never_mix(sglang_manager):
    pool0 = make_pool("page_first")
    ps = pool0.page_size
    rank0 = attach(sglang_manager, pool0, tp_rank=0, tp_size=2)
    ks = keys(2, "tp")
    assert rank0.batch_set_v1(ks, indices([1, 2], ps)) == [True, True]
    others = [
        attach(sglang_manager, make_pool("page_first"), tp_rank=1, tp_size=2),
        attach(sglang_manager, make_pool("page_first"), tp_rank=0, tp_size=1),
        attach(sglang_manager, make_pool("page_first_direct"), tp_rank=0, tp_size=2),
        attach(sglang_manager, make_pool("page_first"), tp_rank=0, tp_size=2, model="org/other"),
    ]
    same = attach(sglang_manager, make_pool("page_first"), tp_rank=0, tp_size=2)
    try:
        assert [o.batch_exists(ks) for o in others] == [0, 0, 0, 0]
        assert same.batch_exists(ks) == 2
    finally:
        for b in [rank0, same, *others]:
            b.close()


def test_namespaces():
    pool = make_pool("layer_first")
    fmt = orbitkv.sglang.storage.pool_format(pool, 1024)
    mha = [pool_namespace(storage_config(None, tp_rank=r, tp_size=2), "kv", fmt) for r in (0, 1)]
    assert mha[0] != mha[1] and "tp=0/2" in mha[0] and "layer_first" in mha[0]
    mla = [pool_namespace(storage_config(None, tp_rank=r, tp_size=2, mla=True), "kv", fmt)
           for r in (0, 1)]
    assert mla[0] == mla[1] and "tp=mla-replicated" in mla[0]
    mamba = [pool_namespace(storage_config(None, tp_rank=r, tp_size=2, mla=True), "mamba", fmt)
             for r in (0, 1)]
    assert mamba[0] != mamba[1]
    assert "org-test-model" in mha[0]
    assert page_key("ab") != page_key("ab.mamba") and len(page_key("ab")) == 32


def test_v2_pools_and_hit_policies(sglang_manager):
    kv, swa = make_pool("page_first"), make_pool("layer_first", layers=2)
    ps = kv.page_size
    backend = attach(sglang_manager, kv)
    backend.register_mem_host_pool_v2(swa, PoolName.SWA)
    backend.on_host_pools_registered()
    try:
        ks = keys(6, "hyb")
        got = backend.batch_set_v2([
            PoolTransfer(name=PoolName.KV, keys=ks, host_indices=indices(range(1, 7), ps)),
            # The window state of the last two pages only.
            PoolTransfer(name=PoolName.SWA, keys=ks[4:], host_indices=indices([5, 6], ps),
                         hit_policy=PoolHitPolicy.TRAILING_PAGES),
        ])
        assert got == {PoolName.KV: [True] * 6, PoolName.SWA: [True, True]}

        trailing = PoolTransfer(name=PoolName.SWA, keys=ks[4:],
                                hit_policy=PoolHitPolicy.TRAILING_PAGES)
        r = backend.batch_exists_v2(ks, [trailing])
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (6, [6])
        assert r.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6}
        # A window of 3 pages is not there for any prefix.
        wide = PoolTransfer(name=PoolName.SWA, keys=ks[3:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        assert backend.batch_exists_v2(ks, [wide]).kv_hit_pages == 0
        # ALL_PAGES needs pages from 0: none of the swa pool.
        every = PoolTransfer(name=PoolName.SWA, keys=ks, hit_policy=PoolHitPolicy.ALL_PAGES)
        assert backend.batch_exists_v2(ks, [every]).kv_hit_pages == 0
        # Only 4 KV pages asked: the window (pages 4, 5) lies beyond them.
        assert backend.batch_exists_v2(ks[:4], [trailing]).kv_hit_pages == 0

        want_kv = [page_bytes(kv, p * ps) for p in range(1, 7)]
        want_swa = [page_bytes(swa, p * ps) for p in (5, 6)]
        got = backend.batch_get_v2([
            PoolTransfer(name=PoolName.KV, keys=ks, host_indices=indices(range(8, 14), ps)),
            PoolTransfer(name=PoolName.SWA, keys=ks[4:], host_indices=indices([8, 9], ps)),
        ])
        assert got == {PoolName.KV: [True] * 6, PoolName.SWA: [True, True]}
        assert [page_bytes(kv, p * ps) for p in range(8, 14)] == want_kv
        assert [page_bytes(swa, p * ps) for p in (8, 9)] == want_swa
        with pytest.raises(RuntimeError, match="mamba"):
            backend.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, keys=ks[:1],
                                               host_indices=indices([1], ps))])
    finally:
        backend.close()


def test_a_killed_manager_raises_and_never_returns_none(manager_binary, tmp_path):
    m = Manager(manager_binary, tmp_path, "64mib", [])
    pool = make_pool("layer_first")
    ps = pool.page_size
    backend = attach(m, pool, timeout_ms=5000)
    ks = keys(3, "dead")
    assert backend.batch_set_v1(ks, indices([1, 2, 3], ps)) == [True] * 3
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    calls = [
        lambda: backend.batch_exists(ks),
        lambda: backend.batch_get_v1(ks, indices([4, 5, 6], ps)),
        lambda: backend.batch_set_v1(ks, indices([4, 5, 6], ps)),
        lambda: backend.get(ks[0]),
        lambda: backend.exists(ks[0]),
        lambda: backend.batch_exists_v2(ks),
    ]
    for call in calls:
        t0 = time.monotonic()
        with pytest.raises(orbitkv.OrbitKVError):
            call()
        assert time.monotonic() - t0 < 5
    backend.close()
    m.stop()


def test_bad_configuration_fails_the_attach(sglang_manager, tmp_path):
    with pytest.raises(ValueError, match="staging_bytes"):
        OrbitKVStorage(storage_config(sglang_manager, staging_bytes=0))
    with pytest.raises(ValueError, match="namespace"):
        OrbitKVStorage(storage_config(sglang_manager, namespace="a|b"))
    with pytest.raises(orbitkv.OrbitKVError):
        OrbitKVStorage(storage_config(None, socket=str(tmp_path / "nothing.sock")))
    backend = OrbitKVStorage(storage_config(sglang_manager))
    try:
        with pytest.raises(RuntimeError, match="no host pool"):
            backend.batch_exists(keys(1))
        backend.register_mem_pool_host(make_pool("layer_first"))
        with pytest.raises(ValueError, match="host indices"):
            backend.batch_get_v1(keys(2), torch.arange(3))
    finally:
        backend.close()


def test_clear_empties_its_namespace_and_nothing_else(sglang_manager):
    """clear() raised NotImplementedError: a namespace could not be emptied."""
    pool = make_pool("page_first")
    ps = pool.page_size
    backend = attach(sglang_manager, pool)
    other = attach(sglang_manager, make_pool("page_first"), namespace="other")
    try:
        ks = keys(4, "clr")
        assert backend.batch_set_v1(ks, indices([1, 2, 3, 4], ps)) == [True] * 4
        assert other.batch_set_v1(ks, indices([1, 2, 3, 4], ps)) == [True] * 4
        assert backend.batch_exists(ks) == 4
        backend.clear()
        assert backend.batch_exists(ks) == 0
        assert backend.batch_get_v1(ks, indices([5, 6, 7, 8], ps)) == [False] * 4
        assert other.batch_exists(ks) == 4  # the same page keys of another namespace
        # Stored again after the clear, byte-exact.
        assert backend.batch_set_v1(ks[:2], indices([1, 2], ps)) == [True] * 2
        assert backend.batch_exists(ks) == 2
        assert backend.batch_get_v1(ks[:2], indices([9, 10], ps)) == [True] * 2
        assert page_bytes(pool, 9 * ps) == page_bytes(pool, 1 * ps)
        assert page_bytes(pool, 10 * ps) == page_bytes(pool, 2 * ps)
    finally:
        other.close()
        backend.close()


def test_stats_count_pages_moved(sglang_manager):
    pool = make_pool("page_first")
    ps = pool.page_size
    backend = attach(sglang_manager, pool)
    try:
        ks = keys(3, "stat")
        backend.batch_set_v1(ks, indices([1, 2, 3], ps))
        backend.batch_get_v1(ks, indices([4, 5, 6], ps))
        s = backend.get_stats()
        assert s.backup_pgs == [3] and s.prefetch_pgs == [3]
        assert s.backup_bandwidth[0] > 0 and s.prefetch_bandwidth[0] > 0
        assert backend.get_stats().backup_pgs == []
    finally:
        backend.close()


def test_sglang_shm_pool_memory_cannot_be_shared_zero_copy(sglang_manager):
    """Why there is a staging copy: SGLang's shm allocator makes its memfd without
    MFD_ALLOW_SEALING, so it cannot be sealed, and the Manager refuses it."""
    pool = make_pool("page_first", allocator_type="shm")
    fd = pool.allocator.fd
    assert fd is not None and pool.kv_buffer.data_ptr() != 0
    with pytest.raises(PermissionError):
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    nbytes = os.fstat(fd).st_size
    layout = orbitkv.page_first_layout(nbytes // 4096, [4096])
    with sglang_manager.client() as c:
        with pytest.raises(orbitkv.OrbitKVError, match="(?i)seal"):
            c.register_instance("zero-copy-probe", 0, "host", layout, [fd])


def test_an_untested_sglang_version_is_refused(monkeypatch):
    import importlib.metadata as md

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: "0.4.0" if name == "sglang" else real(name))
    monkeypatch.delenv("ORBITKV_SGLANG_ALLOW_UNTESTED", raising=False)
    with pytest.raises(ImportError, match="tested with sglang 0.5.23, found 0.4.0"):
        orbitkv.sglang._check_sglang()
    monkeypatch.setenv("ORBITKV_SGLANG_ALLOW_UNTESTED", "1")
    assert orbitkv.sglang._check_sglang() == "0.4.0"


def test_concurrent_calls_share_a_small_staging_area(sglang_manager):
    """SGLang's prefetch and backup threads call at once; with room for two pages
    in staging, four threads moving six pages each still get their own bytes."""
    import threading

    pool = make_pool("page_first", device_tokens=128)
    ps = pool.page_size
    one_page = pool.get_dummy_flat_data_page().numel() * 2
    backend = attach(sglang_manager, pool, staging_bytes=2 * one_page)
    errors = []

    def worker(t: int) -> None:
        try:
            ks = keys(6, f"thread{t}-")
            src, dst = range(t * 6, t * 6 + 6), range(30 + t * 6, 36 + t * 6)
            assert backend.batch_set_v1(ks, indices(src, ps)) == [True] * 6
            assert backend.batch_get_v1(ks, indices(dst, ps)) == [True] * 6
            for a, b in zip(src, dst):
                assert page_bytes(pool, a * ps) == page_bytes(pool, b * ps)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    try:
        assert not any(th.is_alive() for th in threads), "a call hung on the staging area"
        assert not errors, errors
    finally:
        backend.close()


def test_prefix_larger_than_query_budget_exists_and_loads_whole(start_manager):
    """A prefix larger than the reader's share of the Manager's query byte budget
    (a 2 MiB pool with SSD: the pool less its read staging, halved between the
    writer's and the reader's sessions), so its queries are cut
    (budget_limited). batch_exists answered the cut prefix and batch_get_v1
    stopped there; both now follow a cut query with one for the rest."""
    m = start_manager(pool_size="2mib", ssd=True)
    # 128 KiB pages (8 layers x 4 heads x 64, 16 tokens, bf16): 16 pages are 2 MiB.
    shape = dict(layers=8, heads=4, head_dim=64, page_size=16, device_tokens=256)
    src = make_pool("page_first", **shape)
    ps = src.page_size
    n = 16
    ks = keys(n, "budget")
    writer = attach(m, src)
    dst = make_pool("page_first", **shape)
    reader = attach(m, dst)
    try:
        expected = [page_bytes(src, p * ps) for p in range(n)]
        assert writer.batch_set_v1(ks, indices(range(n), ps)) == [True] * n
        # The cut being followed: one query of the whole chain.
        inst = reader._binding().instance
        q = reader._client.query(inst, 0, [page_key(k) for k in ks], 5000)
        reader._client.release_query(inst, q.query)
        assert q.budget_limited and 0 < q.prefix < n, q
        assert reader.batch_exists(ks) == n
        assert reader.exists(ks[0])
        assert reader.batch_exists_v2(ks).kv_hit_pages == n
        targets = list(range(n, 2 * n))
        assert reader.batch_get_v1(ks, indices(targets, ps)) == [True] * n
        assert [page_bytes(dst, p * ps) for p in targets] == expected
        got = reader.batch_get(ks)
        assert [bytes(t.view(torch.uint8).numpy()) for t in got] == expected
    finally:
        reader.close()
        writer.close()
