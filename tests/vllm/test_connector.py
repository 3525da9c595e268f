"""OrbitKVConnector inside vLLM's real Scheduler against a real Manager (see harness.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import harness
import kvreplay
import orbitkv
from harness import BLOCK_SIZE, Engine, Gate, extra, gated_load, prompt, request
from orbitkv.vllm.config import ConnectorConfig
from vllm.v1.request import RequestStatus

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "worker_replay.json"


def test_prefix_hit_across_requests_restores_the_saved_blocks(manager, model_path):
    record = kvreplay.Recording(harness.spec(64, "kv_first"), "")
    e = Engine(harness.vllm_config(model_path, extra(manager)), record=record)
    record.data["namespace"] = e.worker_core.namespace
    a = e.add(request("a", prompt(1, 5 * BLOCK_SIZE + 3)))
    e.run()
    assert e.stats["save_blocks_planned"] == 5  # every complete block, prompt and output
    assert e.stats["saved_blocks"] == 5
    # vLLM's own prefix cache would serve b; drop it so the Manager must.
    assert e.scheduler.reset_prefix_cache()
    b = e.add(request("b", prompt(1, 4 * BLOCK_SIZE) + prompt(2, 20)))
    r = e.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert [s.req_id for s in r.plan.loads] == ["b"] and len(r.plan.loads[0].keys) == 4
    e.run()
    assert e.stats["restored_blocks_dram"] == 4
    assert e.stats["hit_blocks_dram"] == 4
    assert e.stats["restored_bytes"] == 4 * e.worker_core._block_bytes
    assert a.is_finished() and b.is_finished()
    e.run()
    e.assert_empty()
    if os.environ.get("ORBITKV_RECORD_FIXTURE"):
        FIXTURE.parent.mkdir(exist_ok=True)
        record.dump(str(FIXTURE))
    assert any(s["checks"] for s in record.data["steps"])
    e.close()


def test_recorded_fixture_replays_on_host_tensors(manager):
    """The plans the scheduler produced (committed fixture) drive the worker core
    without vLLM, as tests/gpu/vllm_worker_gate.py does with CUDA tensors."""
    from orbitkv.vllm.config import ConnectorConfig
    from orbitkv.vllm.layout import describe_kv_caches, host_tensor
    from orbitkv.vllm.worker import WorkerCore

    rec = json.loads(FIXTURE.read_text())
    for layout in kvreplay.LAYOUTS:
        spec = dict(rec["spec"], layout=layout)
        kv = kvreplay.make_kv_caches(spec, "cpu", host_tensor)
        core = WorkerCore(ConnectorConfig(socket_path=manager.socket_path),
                          rec["namespace"] + f"|test={layout}", 0)
        core.register(describe_kv_caches(kv, spec["num_blocks"]))
        result = kvreplay.replay(rec, core, kv, layout=layout)
        assert result["checked_tokens"] == 4 * BLOCK_SIZE and result["load_steps"] == 1
        core.close()


def test_recorded_fixture_is_what_the_scheduler_plans_now(manager, model_path):
    rec = json.loads(FIXTURE.read_text())
    record = kvreplay.Recording(harness.spec(64, "kv_first"), "")
    e = Engine(harness.vllm_config(model_path, extra(manager)), record=record)
    e.serve(request("a", prompt(1, 5 * BLOCK_SIZE + 3)))
    e.add(request("b", prompt(1, 4 * BLOCK_SIZE) + prompt(2, 20)))
    e.run()
    plans = lambda d: [s["plan"] for s in d["steps"] if s["plan"]["loads"] or s["plan"]["saves"]]
    assert plans(record.data) == plans(rec), "re-record: ORBITKV_RECORD_FIXTURE=1 (see README)"
    e.close()


def test_prefix_hit_across_two_scheduler_instances(manager, model_path):
    e1 = Engine(harness.vllm_config(model_path, extra(manager)))
    e2 = Engine(harness.vllm_config(model_path, extra(manager)), layout="block_first")
    e1.add(request("a", prompt(3, 6 * BLOCK_SIZE + 1)))
    e1.run()
    b = e2.add(request("b", prompt(3, 6 * BLOCK_SIZE + 1)))
    e2.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    e2.run()
    assert e2.stats["restored_blocks_dram"] == 6
    assert e2.stats.get("load_failed_blocks", 0) == 0
    for e in (e1, e2):
        e.run()
        e.assert_empty()
        e.close()


def test_async_load_completes_only_when_the_worker_reports_it(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager)))
    b, gate = gated_load(e, 4, 3 * BLOCK_SIZE + 2)
    for _ in range(5):
        r = e.step()
        assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not r.recving
    gate.open()
    e.run(until=lambda: b.status == RequestStatus.RUNNING)
    assert b.num_computed_tokens >= 3 * BLOCK_SIZE
    e.run()
    assert e.stats["restored_blocks_dram"] == 3
    e.run()
    e.assert_empty()
    e.close()


def test_abort_while_loading_keeps_blocks_until_the_load_ends(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager)))
    harness.abort_while_loading(e, 5)
    e.close()


def test_preemption_while_loading_and_saving(manager, model_path):
    """A decoding request is preempted (its saves in flight) while another loads;
    both finish with the right KV, and the preempted one reloads its own blocks."""
    e = Engine(harness.vllm_config(model_path, extra(manager)), num_blocks=14)
    harness.preempt_while_loading(e, 6, steps=120)
    assert e.stats.get("load_failed_blocks", 0) == 0
    # Every planned block was restored (b's 4, and a preempted request's own saved blocks).
    assert e.stats["restored_blocks_dram"] == e.stats["load_blocks_planned"] >= 4, e.stats
    e.assert_empty()
    e.close()


def test_failed_load_is_recomputed(start_manager, model_path):
    """The scheduler saw hits that are evicted before the worker restores them:
    the blocks are load errors, vLLM recomputes them, the KV is right."""
    m = start_manager(pool_size="1mib")
    e = Engine(harness.vllm_config(model_path, extra(m)))
    b, gate = gated_load(e, 9, 4 * BLOCK_SIZE + 1)
    _evict_everything(m, e.worker_core.namespace, e.worker_core._layout)
    gate.open()
    e.run(until=lambda: b.is_finished())
    assert e.stats["load_failed_blocks"] == 4 and e.stats["recompute_blocks"] == 4
    assert e.stats.get("restored_blocks_dram", 0) == 0
    e.run()
    e.assert_empty()
    e.close()


def _evict_everything(m, ns, layout):
    """Publishes unrelated blocks of the same namespace until the pool dropped the old ones."""
    import hashlib

    pages = orbitkv.allocate_regions(layout.instance_layout())
    with orbitkv.Client(m.socket_path) as c:
        inst = c.register_instance(ns, 9, "host", layout.instance_layout(), pages)
        n = layout.num_blocks
        for i in range(0, 2048, n):
            keys = [hashlib.sha256(b"evict%d" % (i + j)).digest() for j in range(n)]
            c.publish(inst, 0, keys, list(range(n)))


def test_manager_killed_mid_run_gives_misses_not_errors(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager)))
    b, gate = gated_load(e, 10, 3 * BLOCK_SIZE + 1)
    manager.kill()  # while b loads
    gate.open()
    c = e.add(request("c", prompt(11, 3 * BLOCK_SIZE + 1)))
    t0 = time.monotonic()
    e.run()
    assert b.is_finished() and c.is_finished()
    assert e.stats["load_failed_blocks"] == 3 and e.stats["recompute_blocks"] == 3
    assert e.stats.get("query_failures", 0) >= 1
    # A down Manager answers at once; nothing waits for it.
    start = time.monotonic()
    hits = e.sched_core.num_new_matched_blocks("x", list(b.block_hashes), None, 64, 64, 0)
    assert hits == 0 and time.monotonic() - start < 1.0
    assert not e.sched_core.request_finished("x")
    e.assert_empty()
    assert time.monotonic() - t0 < 60
    manager.start()  # the fixture stops it cleanly
    e.close()


def test_paused_manager_is_bounded_by_the_query_timeout(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager, retry_interval_s=30.0)))
    e.serve(request("a", prompt(12, 2 * BLOCK_SIZE + 1)))
    manager.pause()
    try:
        start = time.monotonic()
        b = e.add(request("b", prompt(12, 2 * BLOCK_SIZE + 1)))
        e.step()
        took = time.monotonic() - start
        assert b.status == RequestStatus.RUNNING  # zero hits: computed here
        assert took < 2.0, f"a paused Manager held the scheduler for {took:.2f} s"
        start = time.monotonic()
        c = e.add(request("c", prompt(12, 2 * BLOCK_SIZE + 1)))
        e.step()
        assert time.monotonic() - start < 0.5  # backing off: not even asked
    finally:
        manager.resume()
    e.run()
    assert b.is_finished() and c.is_finished()
    e.close()


def test_finished_request_keeps_blocks_until_its_save_completes(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager)))
    gate = Gate(e.worker_core, publish=True)
    a = e.add(request("a", prompt(13, 3 * BLOCK_SIZE + 1), max_tokens=2))
    e.run(until=lambda: a.is_finished())
    assert gate.entered.wait(10)
    for _ in range(3):
        r = e.step()
        assert "a" in e.scheduler.requests and not r.sending  # blocks held
    assert e.free_blocks() < e.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
    gate.open()
    e.run(until=lambda: not e.scheduler.requests)
    e.assert_empty()
    assert e.stats["saved_blocks"] == 3
    e.close()


def test_cache_salt_separates_keys(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager)))
    e.serve(request("a", prompt(14, 3 * BLOCK_SIZE + 1), cache_salt="tenant-1"))
    b = e.add(request("b", prompt(14, 3 * BLOCK_SIZE + 1), cache_salt="tenant-2"))
    e.step()
    assert b.status == RequestStatus.RUNNING  # no hit under another salt
    e.run()
    assert e.scheduler.reset_prefix_cache()
    c = e.add(request("c", prompt(14, 3 * BLOCK_SIZE + 1), cache_salt="tenant-1"))
    e.step()
    assert c.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    e.run()
    e.run()
    e.assert_empty()
    e.close()


def test_bad_extra_config_is_a_clear_error(model_path):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config key"):
        Engine(harness.vllm_config(model_path, {"sockett_path": "/x"}))
    with pytest.raises(ValueError, match="load_policy must be one of"):
        Engine(harness.vllm_config(model_path, {"load_policy": "eager"}))


def test_unsupported_vllm_version_is_refused():
    from orbitkv.vllm import check_vllm_version

    check_vllm_version("0.33.0")
    with pytest.raises(ImportError, match=r"supports vLLM 0\.33\.x.*has vLLM 0\.32\.0"):
        check_vllm_version("0.32.0")


def test_sync_load_policy_restores_before_the_forward(manager, model_path):
    e = Engine(harness.vllm_config(model_path, extra(manager, load_policy="sync")))
    e.serve(request("a", prompt(15, 3 * BLOCK_SIZE + 1)))
    b = e.add(request("b", prompt(15, 3 * BLOCK_SIZE + 1)))
    r = e.step()
    # Loaded and computed in the same step: no wait for remote KV.
    assert r.plan.sync_load and [s.req_id for s in r.plan.loads] == ["b"]
    assert r.so.has_sync_kv_loads and b.status == RequestStatus.RUNNING
    assert r.so.num_scheduled_tokens["b"] == 1  # only the last prompt token is computed
    e.run()
    assert e.stats["restored_blocks_dram"] == 3
    e.assert_empty()
    e.close()


@pytest.mark.parametrize("policy,saved", [("off", 0), ("prompt", 3), ("all", 4)])
def test_save_policy_chooses_the_blocks_published(manager, model_path, policy, saved):
    e = Engine(harness.vllm_config(model_path, extra(manager, save_policy=policy)))
    # 3 prompt blocks + 8 tokens; 12 output tokens complete a 4th block.
    e.serve(request("a", prompt(16, 3 * BLOCK_SIZE + 8), max_tokens=12))
    assert e.stats.get("saved_blocks", 0) == saved
    e.assert_empty()
    e.close()


def test_start_manager_starts_one_when_none_listens(tmp_path, model_path):
    from orbitkv.vllm import launch

    sock = str(tmp_path / "started.sock")
    cfg = {"socket_path": sock, "start_manager": True, "pool_size": "64mib",
           "manager_args": ["--metrics-port", "0"], "model_id": "tiny-llama"}
    try:
        e = Engine(harness.vllm_config(model_path, cfg))
        assert len(launch._started) == 1 and launch.listening(sock)
        e2 = Engine(harness.vllm_config(model_path, cfg))  # finds it listening
        assert len(launch._started) == 1
        e.serve(request("a", prompt(17, 2 * BLOCK_SIZE + 1)))
        b = e2.add(request("b", prompt(17, 2 * BLOCK_SIZE + 1)))
        e2.step()
        assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        e2.run()
        assert e2.stats["restored_blocks_dram"] == 2
        e.close()
        e2.close()
    finally:
        launch._stop_started()
    assert not launch.listening(sock)
    missing = ConnectorConfig(socket_path=sock, start_manager=True,
                              manager_binary=str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="not executable"):
        launch.ensure_manager(missing)


def test_prefix_larger_than_query_budget_is_a_whole_hit_and_restore(start_manager, model_path):
    """A prompt whose prefix is larger than each session's share of the Manager's
    query byte budget (a 1 MiB pool, with SSD: the budget is the pool less its
    read staging, halved between the scheduler's and the worker's sessions):
    every query of the chain is cut (budget_limited). The scheduler offered
    only the cut prefix as the hit, and the worker restored only its own cut
    prefix and reported the rest as load errors; both now follow a cut query
    with one for the rest of the chain."""
    from orbitkv.vllm.keys import block_key

    m = start_manager(pool_size="1mib", ssd=True)
    n = 120  # blocks of 4 KiB of KV (about 5 KiB objects): 600 KiB
    e = Engine(harness.vllm_config(model_path, extra(m, query_timeout_ms=2000)), num_blocks=160)
    tokens = prompt(18, n * BLOCK_SIZE + 1)
    a = e.serve(request("a", tokens, max_tokens=2))
    assert e.stats["saved_blocks"] == n
    # The cut being followed: one query of the whole chain through the scheduler's probe.
    core = e.sched_core
    keys = [block_key(h, None) for h in a.block_hashes[:n]]
    q = core._client.query(core._probes[0], 0, keys, ttl_ms=2000)
    core._client.release_query(core._probes[0], q.query)
    assert q.budget_limited and 0 < q.prefix < n, q
    b = e.add(request("b", tokens))
    r = e.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert [len(s.keys) for s in r.plan.loads] == [n]  # the whole prefix is the hit
    e.run(until=lambda: b.status == RequestStatus.RUNNING)
    ids = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
    assert b.num_computed_tokens >= n * BLOCK_SIZE
    assert kvreplay.check_rows(e.spec, e.kv, tokens, ids, 0, n * BLOCK_SIZE) == []
    e.run()
    hits = e.stats.get("hit_blocks_dram", 0) + e.stats.get("hit_blocks_ssd", 0)
    restored = e.stats.get("restored_blocks_dram", 0) + e.stats.get("restored_blocks_ssd", 0)
    assert (hits, restored) == (n, n), e.stats
    assert e.stats.get("load_failed_blocks", 0) == 0 and e.stats.get("recompute_blocks", 0) == 0
    assert e.stats["restored_bytes"] == n * e.worker_core._block_bytes
    e.assert_empty()
    e.close()
