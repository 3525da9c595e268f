"""The vLLM-free parts of orbitkv.vllm: configuration, keys, plans, KV layouts."""

from __future__ import annotations

import pytest
import torch

import kvreplay
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.keys import block_key, namespace
from orbitkv.vllm.layout import describe_kv_caches, host_tensor
from orbitkv.vllm.plan import LoadSpec, SaveSpec, StepPlan


def test_config_defaults_and_checked_values():
    c = ConnectorConfig.from_extra_config({"socket_path": "/s", "min_hit_blocks": "2",
                                           "start_manager": "true", "manager_args": ["-x"]})
    assert c.socket_path == "/s" and c.min_hit_blocks == 2 and c.start_manager
    assert c.manager_args == ("-x",) and c.load_policy == "async"
    for bad, match in [({"query_timeout_ms": 0}, "query_timeout_ms must be > 0"),
                       ({"save_policy": "some"}, "save_policy must be one of"),
                       ({"min_hit_blocks": True}, "min_hit_blocks must be an integer"),
                       ({"manager_args": "--pool-size 1gb"}, "manager_args must be a list"),
                       ({"start_manager": "maybe"}, "start_manager must be a boolean"),
                       ({"pool": "1gb"}, r"unknown kv_connector_extra_config key\(s\) \['pool'\]")]:
        with pytest.raises(ValueError, match=match):
            ConnectorConfig.from_extra_config(bad)


def test_keys_are_32_bytes_and_salted():
    h = bytes(range(32))
    assert len(block_key(h)) == 32 and len(block_key(b"\x01" * 8)) == 32
    assert block_key(h) == block_key(h, None) == block_key(h, "")
    assert block_key(h, "a") != block_key(h, "b") != block_key(h)
    with pytest.raises(TypeError):
        block_key("not bytes")
    ns = namespace("m", "float16", 16, "fp", 1, 2)
    assert "tp=1/2" in ns and "block=16" in ns
    with pytest.raises(ValueError, match="rank out of range"):
        namespace("m", "float16", 16, "fp", 2, 2)


def test_plan_round_trips_through_json():
    p = StepPlan(loads=[LoadSpec("r1", [b"\x01" * 32], [7])],
                 saves=[SaveSpec("r2", [b"\x02" * 32, b"\x03" * 32], [1, 2])],
                 delayed_free=["r3"], preempted=["r4"], sync_load=True)
    q = StepPlan.from_json(p.to_json())
    assert q == p
    bad = p.to_json()
    bad["saves"][0]["block_ids"] = [1]
    with pytest.raises(ValueError, match="2 keys but 1 blocks"):
        StepPlan.from_json(bad)


def test_hybrid_plan_round_trips_through_json():
    p = StepPlan(loads=[LoadSpec("r1", [b"\x01" * 32, b"\x04" * 32], [],
                                 group_block_ids=[[5, 6], [0, 9]], skip_blocks=1,
                                 prefix_tokens=32, null_block=0)],
                 saves=[SaveSpec("r2", [b"\x02" * 32], [3], group=1)])
    d = p.to_json()
    assert d["saves"][0]["group"] == 1 and d["loads"][0]["group_block_ids"] == [[5, 6], [0, 9]]
    q = StepPlan.from_json(d)
    assert q == p and q.loads[0].hybrid
    # A single-group plan's JSON is what it was before hybrid support.
    assert "group" not in StepPlan(saves=[SaveSpec("r", [b"\x02" * 32], [3])]).to_json()["saves"][0]


def test_hybrid_layout_has_a_group_per_kv_cache_group_over_shared_tensors():
    spec = dict(_spec("kv_first"), layers=["t0", "t1"])
    t = kvreplay.make_kv_caches(spec, "cpu", host_tensor)
    kv = {"full0": t["t0"], "swa0": t["t0"], "full1": t["t1"], "swa1": t["t1"]}
    lay = describe_kv_caches(kv, 8, {"full0": 0, "full1": 0, "swa0": 1, "swa1": 1})
    il = lay.instance_layout()
    assert [g.group_id for g in il.groups] == [0, 1] and len(il.region_bytes) == 2
    # The two groups' slots of one tensor are the same bytes (a block is one group's at a time).
    assert [(s.region, s.offset) for s in il.groups[0].slots] == [
        (s.region, s.offset) for s in il.groups[1].slots]
    assert lay.block_bytes(0) == lay.block_bytes(1) == lay.block_bytes() // 2
    with pytest.raises(ValueError, match="in no KV cache group"):
        describe_kv_caches(kv, 8, {"full0": 0})
    with pytest.raises(ValueError, match="group 1 has no KV cache tensor"):
        describe_kv_caches({"full0": t["t0"]}, 8, {"full0": 0, "x": 2})


def _spec(layout):
    return {"num_blocks": 8, "block_size": 16, "num_kv_heads": 2, "head_size": 16,
            "dtype": "float16", "layers": ["l0", "l1"], "layout": layout}


@pytest.mark.parametrize("layout", kvreplay.LAYOUTS)
def test_layouts_give_a_k_and_a_v_slot_per_layer(layout):
    kv = kvreplay.make_kv_caches(_spec(layout), "cpu", host_tensor)
    d = describe_kv_caches(kv, 8)
    block = 16 * 2 * 16 * 2
    assert d.device == "host" and len(d.region_bytes) == 2 and len(d.host_regions) == 2
    assert [s.bytes_per_page for s in d.slots] == [block] * 4
    assert [(s.layer, s.index) for s in d.slots] == [("l0", (0,)), ("l0", (1,)), ("l1", (0,)), ("l1", (1,))]
    t = kv["l0"]
    for slot in d.slots[:2]:
        kvi = slot.index[0]
        for page in (0, 5):
            blk = t[page, kvi] if layout == "block_first" else t[kvi, page]
            blk.copy_(torch.randn(blk.shape).to(blk.dtype))
            physical = blk.permute(1, 0, 2) if layout == "hnd" else blk  # (heads, tokens, dim) in memory
            want = physical.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            off = slot.offset + page * slot.page_stride
            got = bytes(d.host_regions[slot.region].view()[off : off + slot.bytes_per_page])
            assert got == want, f"{layout} slot {slot} page {page}"
    d.instance_layout().validate()
    assert d.block_bytes() == 4 * block


def test_layout_errors_are_clear():
    with pytest.raises(ValueError, match="expected"):
        describe_kv_caches({"l": host_tensor((3, 8, 16), torch.float16)}, 8)
    t = host_tensor((2, 8, 16, 4, 16), torch.float16)[:, :, :, :2, :]  # a block with holes
    with pytest.raises(ValueError, match="is not contiguous"):
        describe_kv_caches({"l": t}, 8)
    with pytest.raises(ValueError, match="not in OrbitKV host memory"):
        describe_kv_caches({"l": torch.zeros((2, 8, 16, 2, 16))}, 8)
