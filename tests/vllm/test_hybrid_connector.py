"""OrbitKVConnector with a hybrid KV cache (SupportsHMA) inside vLLM's real
Scheduler against a real Manager: a full-attention group and a sliding-window
group (harness.HYBRID_GROUPS, the two sharing KV tensors as vLLM's hybrid
allocator does). Every step checks every group's KV rows of every running
request byte for byte (harness.Engine.check_running).
"""

from __future__ import annotations

import time

import pytest

from harness import BLOCK_SIZE, Gate, flood_pool, gated_load, group_bytes, hybrid_engine, prompt, request
from orbitkv.hybrid import GroupKind
from orbitkv.vllm import OrbitKVConnector
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
from vllm.v1.request import RequestStatus

import harness

WINDOW = 2 * BLOCK_SIZE + 1  # vLLM's sliding_window: the 32 tokens before the next one


def engine(manager, model_path, **kw):
    return hybrid_engine(manager, model_path, window=WINDOW, **kw)


def test_connector_declares_hma_and_registers_one_storage_group_per_kv_cache_group(
        manager, model_path):
    assert supports_hma(OrbitKVConnector)
    e = engine(manager, model_path)
    # vLLM keeps its hybrid allocator on for this connector (on GPU platforms;
    # on CPU vLLM turns it off, so the harness hands the Scheduler the hybrid
    # KVCacheConfig the GPU path makes).
    assert KVConnectorFactory.supports_hma_config(e.config.kv_transfer_config)
    d = e.worker_core.description
    assert [(g.kind, g.storage_group) for g in d.groups] == [
        (GroupKind.FULL_ATTENTION, 0), (GroupKind.SLIDING_WINDOW, 1)]
    assert d.groups[1].window_tokens == WINDOW - 1
    lay = e.worker_core._layout.instance_layout()
    assert [g.group_id for g in lay.groups] == [0, 1]
    # Two layers per group, K and V each; regions from the shared tensors.
    assert [len(g.slots) for g in lay.groups] == [4, 4]
    assert len(lay.region_bytes) == 2
    assert group_bytes(e, 0) == group_bytes(e, 1) == d.groups[0].bytes == d.groups[1].bytes
    e.close()


def test_hybrid_prefix_hit_across_two_scheduler_instances(manager, model_path):
    e1, e2 = engine(manager, model_path), engine(manager, model_path)
    e1.add(request("a", prompt(3, 6 * BLOCK_SIZE + 3)))
    e1.run()
    # Full-attention blocks 0..5 and the window blocks the forward wrote.
    assert e1.stats["saved_blocks"] == 12
    b = e2.add(request("b", prompt(3, 6 * BLOCK_SIZE) + prompt(4, 20)))
    r = e2.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    (load,) = r.plan.loads
    assert load.hybrid and load.prefix_tokens == 6 * BLOCK_SIZE and load.skip_blocks == 0
    assert e2.stats["queries"] == 1  # one recovery-plan query for the request
    # vLLM allocated the window only: blocks before [96 - 32, 96) are its null block.
    null = e2.scheduler.kv_cache_manager.block_pool.null_block.block_id
    window_ids = load.group_block_ids[1]
    assert window_ids[:4] == [null] * 4 and null not in window_ids[4:6]
    e2.run()
    # Full attention: 6 blocks; the window group: only its 2 blocks in the window.
    assert e2.stats["restored_blocks_dram"] == 8
    assert e2.stats["restored_bytes"] == 6 * group_bytes(e2, 0) + 2 * group_bytes(e2, 1)
    assert e2.stats.get("load_failed_blocks", 0) == 0
    assert b.is_finished()
    for e in (e1, e2):
        e.run()
        e.assert_empty()
        e.close()


def test_hybrid_restore_is_byte_exact_in_every_group(manager, model_path):
    """The restored blocks of both groups hold the forward's bytes (checked
    before the request computes anything after the load)."""
    e1, e2 = engine(manager, model_path), engine(manager, model_path, load_policy="async")
    tokens = prompt(5, 5 * BLOCK_SIZE + 1)
    e1.add(request("a", tokens))
    e1.run()
    b = e2.add(request("b", tokens))
    load = e2.step().plan.loads[0]
    e2.run(until=lambda: b.request_id in e2.scheduler.finished_recving_kv_req_ids
           or b.status != RequestStatus.WAITING_FOR_REMOTE_KVS)
    e2.worker_core.wait_for_saves()
    for g, sp in enumerate(e2.specs):
        ids = load.group_block_ids[g]
        first = 0 if g == 0 else 5 - 2  # the window: the 2 blocks before token 80
        bad = harness.kvreplay.check_rows(sp, e2.kv, tokens, ids, first * BLOCK_SIZE,
                                          5 * BLOCK_SIZE)
        assert not bad, f"group {g}: {bad[:3]}"
    e2.run()
    for e in (e1, e2):
        e.assert_empty()
        e.close()


def test_window_blocks_outside_the_window_are_not_read(manager, model_path):
    """The Manager's plan for the prefix holds the window's blocks only; the
    others are counted as not needed, and the worker restored none of them."""
    e1, e2 = engine(manager, model_path), engine(manager, model_path)
    tokens = prompt(6, 8 * BLOCK_SIZE + 1)
    e1.add(request("a", tokens))
    e1.run()
    b = e2.add(request("b", tokens))
    load = e2.step().plan.loads[0]
    client, inst = e2.worker_core._session()
    q = client.query(inst, 0, load.keys)
    try:
        assert q.prefix_tokens == 8 * BLOCK_SIZE
        assert [p.index for p in q.pieces if p.storage_group == 1] == [6, 7]
        assert [p.index for p in q.pieces if p.storage_group == 0] == list(range(8))
        # The window blocks 0..5 the forward saved are in the Manager, not in the plan.
        assert q.not_needed_bytes == 6 * group_bytes(e2, 1)
    finally:
        client.release_query(inst, q.query)
    e2.run()
    assert e2.stats["restored_bytes"] == 8 * group_bytes(e2, 0) + 2 * group_bytes(e2, 1)
    assert b.is_finished()
    for e in (e1, e2):
        e.assert_empty()
        e.close()


def test_hybrid_local_hit_plus_manager_hit_restores_only_beyond_it(manager, model_path):
    e = engine(manager, model_path)
    load, restored = harness.local_plus_manager_hit(e, 7)
    # Full attention 3..5; the window's blocks 4 and 5 (none of them local).
    assert restored == 3 * group_bytes(e, 0) + 2 * group_bytes(e, 1)
    e.assert_empty()
    e.close()


def test_hybrid_failed_load_is_recomputed(start_manager, model_path):
    """Hits evicted between the scheduler's query and the worker's: the load
    fails as a request (failed_recving), vLLM recomputes it, the KV is right."""
    m = start_manager(pool_size="1mib")
    e = engine(m, model_path)
    b, gate = gated_load(e, 9, 4 * BLOCK_SIZE + 1)
    flood_pool(m, group_bytes(e, 0))
    gate.open()
    assert harness.run_failed_load(e, b) == ["b"]
    assert e.stats["load_failed_blocks"] == 4 and e.stats["recompute_blocks"] == 4
    assert e.stats.get("restored_blocks_dram", 0) == 0
    e.run()
    e.assert_empty()
    e.close()


def test_hybrid_manager_killed_gives_zero_hits_not_errors(manager, model_path):
    e = engine(manager, model_path)
    b, gate = gated_load(e, 10, 3 * BLOCK_SIZE + 1)
    manager.kill()
    gate.open()
    c = e.add(request("c", prompt(10, 3 * BLOCK_SIZE + 1)))
    e.run()
    assert b.is_finished() and c.is_finished()
    assert e.stats["load_failed_blocks"] == 3
    assert e.stats.get("query_failures", 0) >= 1
    start = time.monotonic()
    hits = e.sched_core.num_new_matched_blocks("x", list(b.block_hashes), None, 64, 64, 0)
    assert hits == 0 and time.monotonic() - start < 1.0
    assert not e.sched_core.request_finished("x")
    e.assert_empty()
    manager.start()
    e.close()


def test_hybrid_finished_request_keeps_blocks_until_its_saves_complete(manager, model_path):
    """request_finished_all_groups delays the free while a full-attention save
    is held (the window group's saves pass: the next forward waits for those)."""
    e = engine(manager, model_path)
    gate = Gate(e.worker_core, publish=True, publish_groups={0})
    a = e.add(request("a", prompt(13, 3 * BLOCK_SIZE + 1), max_tokens=2))
    e.run(until=lambda: a.is_finished())
    for _ in range(3):
        r = e.step()
        assert "a" in e.scheduler.requests and not r.sending  # blocks held
    assert e.free_blocks() < e.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
    gate.open()
    e.run(until=lambda: not e.scheduler.requests)
    e.assert_empty()
    assert e.stats["saved_blocks"] == 6  # 3 blocks in each group
    e.close()


def test_hybrid_sync_load_policy_is_refused(manager, model_path):
    with pytest.raises(ValueError, match="load_policy 'sync' with several KV cache groups"):
        engine(manager, model_path, load_policy="sync")
