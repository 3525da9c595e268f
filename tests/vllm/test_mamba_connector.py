"""OrbitKVConnector with Mamba groups (SupportsHMA) inside vLLM's real Scheduler
against a real Manager: full attention + Mamba layers with a conv and an SSM
state of different dtypes (harness.MAMBA_GROUPS, sharing buffers as vLLM's
hybrid allocator does), vLLM's Mamba prefix caching in mamba_cache_mode
"align". Saves are the (group, block, boundary) states vLLM offers; hits land
on a checkpoint. The stand-in forward is a recurrence over the state it reads
(kvreplay.write_state), and every step checks every running request's
attention rows and current state byte for byte (harness.Engine.check_running),
so a state restored wrong makes the request's later states wrong.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import harness
import kvreplay
from harness import (BLOCK_SIZE, MAMBA_GROUPS, STATE_BYTES, Gate, group_bytes, hybrid_engine,
                     prompt, request)
from orbitkv.hybrid import GroupKind, group_mask, object_key
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.keys import block_key
from orbitkv.vllm.layout import describe_kv_caches, state_views
from orbitkv.vllm.worker import WorkerCore
from vllm.v1.request import RequestStatus

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "worker_replay_mamba.json"
STATE = sum(STATE_BYTES) * len(MAMBA_GROUPS[1])  # one checkpoint: every Mamba layer's states


def engine(manager, model_path, **kw):
    return hybrid_engine(manager, model_path, mamba=True, **kw)


def state_block_bytes(e, block: int) -> bytes:
    return b"".join(v[block].numpy().tobytes()
                    for name in MAMBA_GROUPS[1]
                    for v in state_views(e.kv[name], e.kv_config.num_blocks, STATE_BYTES))


def finish(*engines):
    for e in engines:
        e.run()
        e.assert_empty()
        e.close()


def test_mamba_layers_register_one_slot_per_state(manager, model_path):
    e = engine(manager, model_path)
    d = e.worker_core.description
    assert [(g.kind, g.storage_group) for g in d.groups] == [
        (GroupKind.FULL_ATTENTION, 0), (GroupKind.RECURRENT, 1)]
    assert d.groups[1].checkpoint_interval_tokens == BLOCK_SIZE
    # Mamba layers: a conv (bf16) and an SSM (fp32) slot each, the state
    # bytes without vLLM's page padding; attention: K and V per layer.
    lay = e.worker_core._layout
    mamba = [s for s in lay.slots if s.group == 1]
    assert [(s.layer, s.index, s.bytes_per_page) for s in mamba] == [
        (n, (i,), b) for n in MAMBA_GROUPS[1] for i, b in enumerate(STATE_BYTES)]
    assert all(s.page_stride == harness.PAGE_BYTES for s in mamba)
    assert group_bytes(e, 1) == d.groups[1].bytes == STATE
    # Each (attention, Mamba) layer pair shares one buffer: one region each.
    assert len(lay.region_bytes) == 2
    # The state tensors as the Mamba layer sees them (vLLM's bind_kv_cache
    # views, one dtype each) register the same slots as the raw page view.
    import torch

    views = {}
    for name in MAMBA_GROUPS[1]:
        states = state_views(e.kv[name], e.kv_config.num_blocks, STATE_BYTES)
        views[name] = [v.view(dt).view(-1, *shape) for v, dt, shape in
                       zip(states, harness.STATE_DTYPES, harness.STATE_SHAPES)]
    assert [v.dtype for v in views[MAMBA_GROUPS[1][0]]] == [torch.bfloat16, torch.float32]
    got = describe_kv_caches(dict(e.kv, **views), e.kv_config.num_blocks,
                                     {n: g for g, ls in enumerate(MAMBA_GROUPS) for n in ls},
                                     {1: STATE_BYTES})
    assert [(s.region, s.offset, s.page_stride, s.bytes_per_page) for s in got.slots] == [
        (s.region, s.offset, s.page_stride, s.bytes_per_page) for s in lay.slots]
    with pytest.raises(ValueError, match=r"bytes per block, the KV cache spec's states"):
        describe_kv_caches(e.kv, e.kv_config.num_blocks,
                                   {n: g for g, ls in enumerate(MAMBA_GROUPS) for n in ls},
                                   {1: [STATE_BYTES[0]]})
    e.close()


def test_mamba_prefix_hit_restores_the_checkpoint_byte_for_byte(manager, model_path):
    """A prefix saved by one scheduler instance is a hit in another: the
    attention blocks and the state after exactly the hit, restored into the
    block vLLM allocated for it, byte-identical to the saved one."""
    e1, e2 = engine(manager, model_path), engine(manager, model_path)
    a = e1.add(request("a", prompt(3, 6 * BLOCK_SIZE + 3)))
    saves = []
    while e1.scheduler.has_requests():
        saves += [(s.group, s.block_ids[0]) for s in e1.step().plan.saves if s.group == 1]
    # vLLM computes [0, 96) in one chunk (align mode ends it on the last block
    # boundary of the prompt): one state offered, at 96, in the block it names.
    assert len(saves) == 1 and e1.stats["saved_blocks"] == 6 + 1
    saved_state = state_block_bytes(e1, saves[0][1])
    b = e2.add(request("b", prompt(3, 6 * BLOCK_SIZE) + prompt(4, 20)))
    load = e2.step().plan.loads[0]
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert load.prefix_tokens == 6 * BLOCK_SIZE and load.skip_blocks == 0
    null = e2.scheduler.kv_cache_manager.block_pool.null_block.block_id
    # The Mamba group: null blocks, then the one block for the state at 96.
    ids = load.group_block_ids[1]
    assert ids[:5] == [null] * 5 and ids[5] != null
    e2.run(until=lambda: b.status != RequestStatus.WAITING_FOR_REMOTE_KVS)
    assert state_block_bytes(e2, ids[5]) == saved_state
    assert not kvreplay.check_state(e2.specs[1], e2.kv, list(b.all_token_ids), ids, 96)
    e2.run()
    assert e2.stats["restored_blocks_dram"] == 6 + 1
    assert e2.stats["restored_bytes"] == 6 * group_bytes(e2, 0) + STATE
    assert e2.stats.get("load_failed_blocks", 0) == 0
    # b went on from the restored state (the recurrence read it): its state at
    # 112 is right (checked every step) and was saved as b's next checkpoint.
    assert e2.stats["saved_blocks"] == 1 + 1
    # The restored checkpoint, which vLLM offers again once cached, is not saved again.
    assert e2.stats["save_blocks_planned"] == 1 + 1 and "save_skipped_blocks" not in e2.stats
    assert a.is_finished() and b.is_finished()
    finish(e1, e2)


def test_mamba_hit_lands_on_a_checkpoint(manager, model_path):
    """With chunked prefill (64 tokens a step) vLLM keeps states at 64 and 96
    only. A prompt sharing 5 attention blocks (80 tokens) is a hit of 64 (the
    checkpoint), one sharing 3 blocks (48 tokens) no hit at all."""
    cfg = lambda: harness.vllm_config(model_path, harness.extra(manager), max_batched=64,
                                      mamba=True)
    e1 = harness.Engine(cfg(), mamba=True)
    e1.add(request("a", prompt(5, 6 * BLOCK_SIZE + 3)))
    e1.run()
    assert e1.stats["saved_blocks"] == 6 + 2  # attention 0..5, states at 64 and 96
    e2 = harness.Engine(cfg(), mamba=True)
    b = e2.add(request("b", prompt(5, 5 * BLOCK_SIZE) + prompt(6, 30)))
    c = e2.add(request("c", prompt(5, 3 * BLOCK_SIZE) + prompt(7, 30)))
    loads = {}
    while e2.scheduler.has_requests():
        loads.update((s.req_id, s) for s in e2.step().plan.loads)
    assert sorted(loads) == ["b"] and loads["b"].prefix_tokens == 4 * BLOCK_SIZE
    assert e2.stats["hit_blocks_dram"] == 4
    assert e2.stats["restored_blocks_dram"] == 4 + 1
    assert b.is_finished() and c.is_finished()
    finish(e1, e2)


def test_mamba_local_hit_plus_manager_hit(manager, model_path):
    """vLLM's local cache holds 3 blocks and the state at 48, the Manager the
    prefix to 96: only attention blocks 3..5 and the state at 96 are restored."""
    e = engine(manager, model_path)
    load, restored = harness.local_plus_manager_hit(e, 7)
    assert restored == 3 * group_bytes(e, 0) + STATE
    finish(e)


def _flip_checkpoint_on_ssd(m, e, req, position: int) -> None:
    """Waits until the checkpoint after `position` tokens of `req` lives on SSD
    only, then flips a byte of its object header there (a Corruption on read)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
    from real_model_gate import flip_key_byte

    chain = [block_key(h, None) for h in req.block_hashes[: position // BLOCK_SIZE]]
    client, inst = e.sched_core._session(), e.sched_core._probes[0]
    deadline = time.monotonic() + 20
    while True:
        q = client.query(inst, 0, chain)
        tiers = [p.tier for p in q.pieces if p.storage_group == 1]
        if q.prefix:
            client.release_query(inst, q.query)
        if tiers == ["ssd"]:
            break
        assert time.monotonic() < deadline, f"the checkpoint stayed in DRAM: {tiers}"
        time.sleep(0.05)
    key = object_key(chain[-1], group_mask(e.worker_core.description.groups[1]))
    shards = sorted(p for p in m.ssd_dir.iterdir() if p.name.startswith("cache.bin"))
    assert flip_key_byte(shards, key) >= 1


def test_mamba_state_load_failure_is_recomputed(start_manager, model_path):
    """The checkpoint (on SSD only) is corrupted between the scheduler's hit and
    the worker's restore; the attention blocks restore, the state does not: the
    load fails as a request, vLLM recomputes it and the states are right."""
    m = start_manager(ssd=True, extra=["--checkpoint-dram-percent", "0"])
    e = engine(m, model_path)
    e.serve(request("a", prompt(9, 4 * BLOCK_SIZE + 1)))
    gate = Gate(e.worker_core, query=True)
    b = e.add(request("b", prompt(9, 4 * BLOCK_SIZE + 1)))
    e.step()
    assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert gate.entered.wait(10)
    _flip_checkpoint_on_ssd(m, e, b, 4 * BLOCK_SIZE)
    gate.open()
    assert harness.run_failed_load(e, b) == ["b"]
    assert e.stats["load_failed_blocks"] == 4 and e.stats["recompute_blocks"] == 4
    assert e.stats["restored_blocks_dram"] == 4  # the attention blocks; not the state
    finish(e)


def test_mamba_abort_while_loading_keeps_blocks_until_the_load_ends(manager, model_path):
    e = engine(manager, model_path)
    harness.abort_while_loading(e, 11)
    finish(e)


def test_mamba_preemption_while_loading_and_saving(manager, model_path):
    """Decoding requests are preempted (their state saves in flight: the
    forward waits for them) while another loads; all finish with the right
    states, and a preempted one resumes from its own saved checkpoint."""
    e = engine(manager, model_path, num_blocks=20)
    harness.preempt_while_loading(e, 12)
    assert e.stats.get("load_failed_blocks", 0) == 0
    # Two loads: b's 4 blocks and the state at 64, and a preempted request's
    # own saved blocks and its latest checkpoint; every piece restored.
    assert e.stats["load_blocks_planned"] > 4, e.stats
    assert e.stats["restored_blocks_dram"] == e.stats["load_blocks_planned"] + 2, e.stats
    finish(e)


def test_mamba_state_saves_finish_before_the_next_forward(manager, model_path):
    """A state block holds the offered state only until the next forward (vLLM
    frees or rewrites it): the next step waits for the held state save
    (handle_preemptions), then both steps' blocks are saved."""
    import threading

    e = engine(manager, model_path)
    gate = Gate(e.worker_core, publish=True, publish_groups={1})
    a = e.add(request("a", prompt(15, 3 * BLOCK_SIZE + 1), max_tokens=2))
    r = e.step()  # [0, 48): the state at 48 offered and saved (held at the gate)
    assert [s.group for s in r.plan.saves] == [1, 0]
    assert gate.entered.wait(10)
    t = threading.Thread(target=e.step)
    t.start()
    t.join(0.5)
    assert t.is_alive(), "the next forward did not wait for the state save"
    gate.open()
    t.join(30)
    assert not t.is_alive()
    e.run(until=lambda: not e.scheduler.requests)
    assert a.is_finished() and e.stats["saved_blocks"] == 3 + 1
    finish(e)


@pytest.mark.parametrize("prefix_caching,spec,message", [
    (False, dict(mode="none"), "prefix caching is off"),
    (True, dict(mode="none"), "mamba_cache_mode 'none'"),
    (True, dict(num_speculative_blocks=1), "speculative blocks"),
])
def test_mamba_configurations_the_connector_cannot_serve_are_refused_at_init(
        manager, model_path, prefix_caching, spec, message):
    from orbitkv.vllm import OrbitKVConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    config = harness.vllm_config(model_path, harness.extra(manager), mamba=True,
                                 prefix_caching=prefix_caching)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ValueError, match=message):
            OrbitKVConnector(config, role, harness.mamba_kv_cache_config(64, **spec))


def test_mamba_prefix_hit_recorded_for_the_worker_gate(manager, model_path):
    """The plans of a Mamba prefix hit, recorded for tests/gpu/vllm_worker_gate.py
    (ORBITKV_RECORD_FIXTURE=1 re-records; otherwise they must match the
    committed fixture), replayed here on host tensors without vLLM."""
    record = kvreplay.Recording({}, "")
    e = engine(manager, model_path, record=record)
    record.data["namespace"] = e.worker_core.namespace
    record.data["spec"] = {"num_blocks": e.kv_config.num_blocks, "groups": e.specs,
                           "page_bytes": harness.PAGE_BYTES,
                           "description": e.worker_core.description.to_dict()}
    e.serve(request("a", prompt(16, 6 * BLOCK_SIZE + 3)))
    b = e.add(request("b", prompt(16, 6 * BLOCK_SIZE) + prompt(17, 20)))
    e.run()
    assert b.is_finished() and e.stats["restored_blocks_dram"] == 6 + 1
    e.close()
    if os.environ.get("ORBITKV_RECORD_FIXTURE"):
        record.dump(str(FIXTURE))
    rec = json.loads(FIXTURE.read_text())
    plans = lambda d: [s["plan"] for s in d["steps"] if s["plan"]["loads"] or s["plan"]["saves"]]
    assert plans(json.loads(json.dumps(record.data))) == plans(rec), \
        "re-record: ORBITKV_RECORD_FIXTURE=1 (see README)"
    assert rec["spec"] == json.loads(json.dumps(record.data["spec"]))
    # The replay: a fresh worker core and tensors, every load checked byte for byte.
    kv, layout, d = kvreplay.mamba_worker_inputs(rec, "cpu", harness.host_tensor)
    core = WorkerCore(ConnectorConfig(socket_path=manager.socket_path),
                      rec["namespace"] + "|test=replay", 0, description=d)
    core.register(layout)
    result = kvreplay.replay(rec, core, kv)
    stats = core.take_stats()
    core.close()
    assert result["load_steps"] == 1 and result["checked_tokens"] == 6 * BLOCK_SIZE
    assert stats["restored_blocks_dram"] == 6 + 1 and stats["restored_bytes"] == (
        6 * layout.block_bytes(0) + STATE)
