"""orbitkv.sglang.OrbitKVStorage against SGLang's real storage interface, its MHA
host pool on CPU memory, and a real orbitkv-cache-manager."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time

import pytest
import torch
from conftest import LAYOUTS, Manager, make_mamba_pool, make_pool, storage_config
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


def pages_bytes(pool, pages) -> list[bytes]:
    """The flat data page bytes of whole pages `pages` of `pool`."""
    return [page_bytes(pool, p * pool.page_size) for p in pages]


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


@contextlib.contextmanager
def attached(manager, pool, **kw):
    """attach(), closing the backend on the way out."""
    backend = attach(manager, pool, **kw)
    try:
        yield backend
    finally:
        backend.close()


def copy_through(writer, src, src_pages, reader, dst, dst_pages, ks) -> None:
    """Stores pages `src_pages` of `src` under `ks` through `writer`, loads them
    into `dst_pages` of `dst` through `reader`, and checks the bytes."""
    ps = src.page_size
    expected = pages_bytes(src, src_pages)
    assert writer.batch_set_v1(ks, indices(src_pages, ps)) == [True] * len(ks)
    assert reader.batch_get_v1(ks, indices(dst_pages, dst.page_size)) == [True] * len(ks)
    assert pages_bytes(dst, dst_pages) == expected


def test_dynamic_factory_builds_the_backend(sglang_manager):
    with attached(sglang_manager, make_pool("layer_first")) as backend:
        assert isinstance(backend, OrbitKVStorage)
        assert isinstance(backend, HiCacheStorage)
        assert orbitkv.sglang.SGLANG_VERSION == "0.5.23"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_is_byte_exact(sglang_manager, layout):
    src, dst = make_pool(layout), make_pool(layout)
    ks = keys(6, layout)
    # Another engine (its own pool, its own connection) restores into other pages.
    with attached(sglang_manager, src) as writer, attached(sglang_manager, dst) as reader:
        copy_through(writer, src, range(1, 7), reader, dst, [9, 3, 12, 5, 7, 10], ks)
        assert writer.batch_exists(ks) == 6


def test_longest_prefix_answers(sglang_manager):
    pool = make_pool("page_first")
    ps = pool.page_size
    with attached(sglang_manager, pool) as backend:
        a, b, c, x = keys(4, "p")
        assert backend.batch_exists([a, b, c]) == 0
        assert backend.batch_exists([]) == 0
        assert backend.batch_set_v1([a, b, c], indices([1, 2, 3], ps)) == [True] * 3
        assert backend.batch_exists([a, b, c]) == 3
        assert backend.batch_exists([a, b, x, c]) == 2
        assert backend.batch_exists([x, a]) == 0
        untouched = pages_bytes(pool, (6, 7))
        assert backend.batch_get_v1([a, b, x, c], indices([4, 5, 6, 7], ps)) == [
            True, True, False, False]
        assert pages_bytes(pool, (4, 5)) == pages_bytes(pool, (1, 2))
        assert pages_bytes(pool, (6, 7)) == untouched


def test_batches_larger_than_staging_go_through_in_chunks(sglang_manager):
    src = make_pool("layer_first", device_tokens=128)
    dst = make_pool("layer_first", device_tokens=128)
    one_page = src.get_dummy_flat_data_page().numel() * 2
    with attached(sglang_manager, src, staging_bytes=2 * one_page) as writer, \
            attached(sglang_manager, dst, staging_bytes=3 * one_page) as reader:
        copy_through(writer, src, range(7), reader, dst, range(10, 17), keys(7, "chunk"))


def test_single_key_methods_share_the_page_format(sglang_manager):
    pool = make_pool("layer_first")
    ps = pool.page_size
    with attached(sglang_manager, pool) as backend:
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


def test_tp_ranks_layouts_and_models_never_mix(sglang_manager):
    ks = keys(2, "tp")
    with contextlib.ExitStack() as stack:
        def on(layout="page_first", **kw):
            return stack.enter_context(attached(sglang_manager, make_pool(layout), **kw))

        pool0 = make_pool("page_first")
        rank0 = stack.enter_context(attached(sglang_manager, pool0, tp_rank=0, tp_size=2))
        assert rank0.batch_set_v1(ks, indices([1, 2], pool0.page_size)) == [True, True]
        others = [on(tp_rank=1, tp_size=2), on(tp_rank=0, tp_size=1),
                  on("page_first_direct", tp_rank=0, tp_size=2),
                  on(tp_rank=0, tp_size=2, model="org/other")]
        assert [o.batch_exists(ks) for o in others] == [0, 0, 0, 0]
        assert on(tp_rank=0, tp_size=2).batch_exists(ks) == 2


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
    with attached(sglang_manager, kv) as backend:
        backend.register_mem_host_pool_v2(swa, PoolName.SWA)
        backend.on_host_pools_registered()
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

        want_kv, want_swa = pages_bytes(kv, range(1, 7)), pages_bytes(swa, (5, 6))
        got = backend.batch_get_v2([
            PoolTransfer(name=PoolName.KV, keys=ks, host_indices=indices(range(8, 14), ps)),
            PoolTransfer(name=PoolName.SWA, keys=ks[4:], host_indices=indices([8, 9], ps)),
        ])
        assert got == {PoolName.KV: [True] * 6, PoolName.SWA: [True, True]}
        assert pages_bytes(kv, range(8, 14)) == want_kv
        assert pages_bytes(swa, (8, 9)) == want_swa
        with pytest.raises(RuntimeError, match="mamba"):
            backend.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, keys=ks[:1],
                                               host_indices=indices([1], ps))])


class CountingClient:
    """An orbitkv.Client whose queries are counted (a proxy: the pybind class takes
    no new attributes)."""

    def __init__(self, client):
        self._c, self.queries = client, 0

    def __getattr__(self, name):
        return getattr(self._c, name)

    def query(self, *a, **kw):
        self.queries += 1
        return self._c.query(*a, **kw)


def hybrid_attach(manager, kv, swa, mamba, **kw) -> OrbitKVStorage:
    """What SGLang's hybrid controller does: the KV pool, the v2 pools, then
    on_host_pools_registered."""
    backend = attach(manager, kv, window_pages={"swa": 2}, **kw)
    backend.register_mem_host_pool_v2(swa, PoolName.SWA)
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.on_host_pools_registered()
    return backend


def test_v2_hybrid_set_is_planned_by_the_manager(sglang_manager):
    """kv + swa (window 2 pages, from extra_config) + mamba: one hybrid set of
    instances sharing one model description. KV pages 0..5 stored through v1,
    swa all but page 4, mamba states after pages 3 and 5: the Manager's plan
    over the 6 keys is P = 4 (at 6 the window needs page 4; at 5 the state is
    missing), answered in one query; each pool restores its own pieces into
    another engine's pools, byte for byte."""
    kv, swa, mamba = make_pool("page_first"), make_pool("layer_first", layers=2), make_mamba_pool()
    ps = kv.page_size
    ks = keys(6, "plan")
    writer = hybrid_attach(sglang_manager, kv, swa, mamba)
    assert writer.hybrid is not None
    assert [g.kind.name for g in writer.hybrid.groups] == ["FULL_ATTENTION", "SLIDING_WINDOW",
                                                           "RECURRENT"]
    assert writer.batch_set_v1(ks, indices(range(1, 7), ps)) == [True] * 6
    have_swa = [0, 1, 2, 3, 5]
    got = writer.batch_set_v2([
        PoolTransfer(name=PoolName.SWA, keys=[ks[i] for i in have_swa],
                     host_indices=indices([i + 1 for i in have_swa], ps),
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
        PoolTransfer(name=PoolName.MAMBA, keys=[ks[3], ks[5]], host_indices=torch.tensor([4, 6]),
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ])
    assert got == {PoolName.SWA: [True] * 5, PoolName.MAMBA: [True, True]}

    r_kv, r_swa, r_mamba = (make_pool("page_first"), make_pool("layer_first", layers=2),
                            make_mamba_pool(seed=1))
    reader = hybrid_attach(sglang_manager, r_kv, r_swa, r_mamba)
    try:
        counting = CountingClient(reader._client)
        for b in reader._bindings.values():
            b._client = counting
        lookups = [PoolTransfer(name=PoolName.SWA, keys=ks[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
                   PoolTransfer(name=PoolName.MAMBA, keys=ks[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        r = reader.batch_exists_v2(ks, lookups)
        assert counting.queries == 1
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [4])
        assert r.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.SWA: 4, PoolName.MAMBA: 4}
        assert reader.batch_exists(ks) == 4
        assert reader.batch_exists_v2(ks[:3]).kv_hit_pages == 0  # no state after page 2

        # KV through v1, the window and the state through v2, as SGLang loads them.
        assert reader.batch_get_v1(ks[:4], indices(range(8, 12), ps)) == [True] * 4
        assert pages_bytes(r_kv, range(8, 12)) == pages_bytes(kv, range(1, 5))
        got = reader.batch_get_v2([
            PoolTransfer(name=PoolName.SWA, keys=ks[2:4], host_indices=indices([8, 9], ps)),
            PoolTransfer(name=PoolName.MAMBA, keys=ks[3:4], host_indices=torch.tensor([12])),
        ])
        assert got == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}
        assert pages_bytes(r_swa, (8, 9)) == pages_bytes(swa, (3, 4))
        assert page_bytes(r_mamba, 12) == page_bytes(mamba, 4)
        # A window with a missing page restores nothing of it.
        missing = reader.batch_get_v2([
            PoolTransfer(name=PoolName.SWA, keys=ks[4:6], host_indices=indices([10, 11], ps))])
        assert missing == {PoolName.SWA: [False, False]}
        # The same pages in a dense set (no window configured) are other objects.
        with attached(sglang_manager, make_pool("page_first")) as dense:
            assert dense.batch_exists(ks) == 0
    finally:
        reader.close()
        writer.close()


def test_v2_kv_and_mamba_are_a_hybrid_set_without_configuration(sglang_manager):
    kv, mamba = make_pool("page_first"), make_mamba_pool()
    with attached(sglang_manager, kv) as backend:
        backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
        backend.on_host_pools_registered()
        assert [g.name for g in backend.hybrid.groups] == ["kv", "mamba"]
        ks = keys(3, "gdn")
        assert backend.batch_set_v1(ks, indices([1, 2, 3], kv.page_size)) == [True] * 3
        assert backend.batch_exists(ks) == 0  # no state stored yet
        assert backend.batch_set_v2([PoolTransfer(
            name=PoolName.MAMBA, keys=ks[1:2], host_indices=torch.tensor([2]))]) == {
            PoolName.MAMBA: [True]}
        assert backend.batch_exists(ks) == 2
        with pytest.raises(ValueError, match="after the hybrid pool set"):
            backend.register_mem_host_pool_v2(make_pool("layer_first"), PoolName.SWA)


def test_v2_swa_without_a_window_is_looked_up_per_pool(sglang_manager):
    with attached(sglang_manager, make_pool("page_first")) as backend:
        backend.register_mem_host_pool_v2(make_pool("layer_first"), PoolName.SWA)
        backend.on_host_pools_registered()
        assert backend.hybrid is None
    with pytest.raises(ValueError, match="window_pages"):
        OrbitKVStorage(storage_config(sglang_manager, window_pages={"swa": 0}))


def kill_and_expect_errors(m, backend, calls) -> None:
    """SIGKILLs the Manager; each call must then raise an OrbitKVError within the
    client's timeout (never return None or hang)."""
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    for call in calls:
        t0 = time.monotonic()
        with pytest.raises(orbitkv.OrbitKVError):
            call()
        assert time.monotonic() - t0 < 5
    backend.close()
    m.stop()


def test_a_killed_manager_raises_and_never_returns_none(manager_binary, tmp_path):
    m = Manager(manager_binary, tmp_path, "64mib", [])
    pool = make_pool("layer_first")
    ps = pool.page_size
    backend = attach(m, pool, timeout_ms=5000)
    ks = keys(3, "dead")
    assert backend.batch_set_v1(ks, indices([1, 2, 3], ps)) == [True] * 3
    kill_and_expect_errors(m, backend, [
        lambda: backend.batch_exists(ks),
        lambda: backend.batch_get_v1(ks, indices([4, 5, 6], ps)),
        lambda: backend.batch_set_v1(ks, indices([4, 5, 6], ps)),
        lambda: backend.get(ks[0]),
        lambda: backend.exists(ks[0]),
        lambda: backend.batch_exists_v2(ks),
    ])


def test_a_killed_manager_raises_for_a_hybrid_set(manager_binary, tmp_path):
    m = Manager(manager_binary, tmp_path, "64mib", [])
    kv, mamba = make_pool("page_first"), make_mamba_pool()
    backend = attach(m, kv, timeout_ms=5000)
    backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    backend.on_host_pools_registered()
    ks = keys(2, "dead-hybrid")
    assert backend.batch_set_v1(ks, indices([1, 2], kv.page_size)) == [True] * 2
    state = [PoolTransfer(name=PoolName.MAMBA, keys=ks[1:], host_indices=torch.tensor([3]),
                          hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    kill_and_expect_errors(m, backend, [
        lambda: backend.batch_exists_v2(ks, state),
        lambda: backend.batch_get_v2(state),
        lambda: backend.batch_set_v2(state),
        lambda: backend.batch_get_v1(ks, indices([4, 5], kv.page_size)),
    ])


def test_bad_configuration_fails_the_attach(sglang_manager, tmp_path):
    with pytest.raises(ValueError, match="staging_bytes"):
        OrbitKVStorage(storage_config(sglang_manager, staging_bytes=0))
    with pytest.raises(ValueError, match="namespace"):
        OrbitKVStorage(storage_config(sglang_manager, namespace="a|b"))
    with pytest.raises(orbitkv.OrbitKVError):
        OrbitKVStorage(storage_config(None, socket=str(tmp_path / "nothing.sock")))
    with contextlib.closing(OrbitKVStorage(storage_config(sglang_manager))) as backend:
        with pytest.raises(RuntimeError, match="no host pool"):
            backend.batch_exists(keys(1))
        backend.register_mem_pool_host(make_pool("layer_first"))
        with pytest.raises(ValueError, match="host indices"):
            backend.batch_get_v1(keys(2), torch.arange(3))


def test_clear_empties_its_namespace_and_nothing_else(sglang_manager):
    """clear() raised NotImplementedError: a namespace could not be emptied."""
    pool = make_pool("page_first")
    ps = pool.page_size
    with attached(sglang_manager, pool) as backend, \
            attached(sglang_manager, make_pool("page_first"), namespace="other") as other:
        ks = keys(4, "clr")
        assert backend.batch_set_v1(ks, indices([1, 2, 3, 4], ps)) == [True] * 4
        assert other.batch_set_v1(ks, indices([1, 2, 3, 4], ps)) == [True] * 4
        assert backend.batch_exists(ks) == 4
        backend.clear()
        assert backend.batch_exists(ks) == 0
        assert backend.batch_get_v1(ks, indices([5, 6, 7, 8], ps)) == [False] * 4
        assert other.batch_exists(ks) == 4  # the same page keys of another namespace
        # Stored again after the clear, byte-exact.
        copy_through(backend, pool, [1, 2], backend, pool, [9, 10], ks[:2])
        assert backend.batch_exists(ks) == 2


def test_stats_count_pages_moved(sglang_manager):
    pool = make_pool("page_first")
    ps = pool.page_size
    with attached(sglang_manager, pool) as backend:
        ks = keys(3, "stat")
        backend.batch_set_v1(ks, indices([1, 2, 3], ps))
        backend.batch_get_v1(ks, indices([4, 5, 6], ps))
        s = backend.get_stats()
        assert s.backup_pgs == [3] and s.prefetch_pgs == [3]
        assert s.backup_bandwidth[0] > 0 and s.prefetch_bandwidth[0] > 0
        assert backend.get_stats().backup_pgs == []


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
    one_page = pool.get_dummy_flat_data_page().numel() * 2
    errors = []
    with attached(sglang_manager, pool, staging_bytes=2 * one_page) as backend:
        def worker(t: int) -> None:
            try:
                copy_through(backend, pool, range(t * 6, t * 6 + 6), backend, pool,
                             range(30 + t * 6, 36 + t * 6), keys(6, f"thread{t}-"))
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not any(th.is_alive() for th in threads), "a call hung on the staging area"
        assert not errors, errors


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
    dst = make_pool("page_first", **shape)
    with attached(m, src) as writer, attached(m, dst) as reader:
        expected = pages_bytes(src, range(n))
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
        assert pages_bytes(dst, targets) == expected
        got = reader.batch_get(ks)
        assert [bytes(t.view(torch.uint8).numpy()) for t in got] == expected
