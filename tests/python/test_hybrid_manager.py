"""A hybrid model through the wheel module and a real Manager: register with an
orbitkv.hybrid description, publish each group's pieces under plain chain keys
(block_key_index / checkpoint_key_index pick the key), query the recovery plan
and restore it by source index, every byte checked."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import orbitkv
from orbitkv.hybrid import (
    GroupDescription as G,
    GroupKind as K,
    ModelDescription,
    block_key_index,
    checkpoint_key_index,
)

PAGES = 32
# storage group -> slot sizes: attn one 4096-byte slot, swa 2048, gdn conv 1000 + SSM 3000.
SLOTS = {0: [4096], 1: [2048], 2: [1000, 3000]}


def description(window: int = 48) -> ModelDescription:
    return ModelDescription(16, [
        G("attn", K.FULL_ATTENTION, 0, 16, 4096),
        G("swa", K.SLIDING_WINDOW, 1, 16, 2048, window_tokens=window),
        G("gdn", K.RECURRENT, 2, 16, 4000, checkpoint_interval_tokens=64),
    ])


def hybrid_layout() -> orbitkv.InstanceLayout:
    groups, regions = [], []
    for gid, sizes in SLOTS.items():
        g = orbitkv.GroupLayout(group_id=gid, slot_bytes=sizes)
        for s, size in enumerate(sizes):
            g.slots.append(orbitkv.SlotLayout(s, len(regions), 0, size, size))
            regions.append(PAGES * size)
        groups.append(g)
    return orbitkv.InstanceLayout(PAGES, regions, groups)


class HybridEngine:
    def __init__(self):
        self.layout = hybrid_layout()
        self.regions = orbitkv.allocate_regions(self.layout)
        self.arrays = [r.numpy() for r in self.regions]

    def slots(self, gid: int):
        return [g for g in self.layout.groups if g.group_id == gid][0].slots

    def view(self, s: orbitkv.SlotLayout, page: int) -> np.ndarray:
        off = s.page_offset(page)
        return self.arrays[s.region][off : off + s.bytes_per_page]

    def fill(self, gid: int, page: int, seed: int) -> bytes:
        rng = np.random.default_rng(seed)
        out = []
        for s in self.slots(gid):
            data = rng.integers(0, 256, s.bytes_per_page, dtype=np.uint8)
            self.view(s, page)[:] = data
            out.append(data.tobytes())
        return b"".join(out)

    def read(self, gid: int, page: int) -> bytes:
        return b"".join(self.view(s, page).tobytes() for s in self.slots(gid))

    def clear(self) -> None:
        for a in self.arrays:
            a[:] = 0


def chain(n: int) -> list[bytes]:
    return [hashlib.sha256(f"hybrid/{i}".encode()).digest() for i in range(n)]


def test_hybrid_round_trip_restores_the_plan_byte_exact(client):
    d = description()
    eng = HybridEngine()
    inst = client.register_instance("hybrid-py", 0, "host", eng.layout, eng.regions, model=d)
    keys = chain(10)
    attn, swa, gdn = d.groups
    want = {}
    # attn blocks 0..9, swa all but 8, gdn checkpoints at 64 and 128 (the README's example).
    for g, pieces in ((attn, range(10)), (swa, [0, 1, 2, 3, 4, 5, 6, 7, 9])):
        for b in pieces:
            want[(g.storage_group, b)] = eng.fill(g.storage_group, b, 1000 * g.storage_group + b)
            r = client.publish(inst, g.storage_group, [keys[block_key_index(d, g, b)]], [b])
            assert r.sealed == 1
    for pos in (64, 128):
        want[(2, pos)] = eng.fill(2, pos // 16, 2000 + pos)
        assert client.publish(inst, 2, [keys[checkpoint_key_index(d, pos)]], [pos // 16]).sealed == 1

    q = client.query(inst, 0, keys)
    assert q.prefix_tokens == 128
    assert [(p.group, p.index) for p in q.pieces] == (
        [(0, b) for b in range(8)] + [(1, 5), (1, 6), (1, 7), (2, 128)])
    assert q.prefix == len(q.pieces) == len(q.sources)
    assert all(p.tier == "dram" for p in q.pieces)
    assert q.logical_bytes == 8 * 4096 + 3 * 2048 + 4000
    assert q.not_needed_bytes == 5 * 2048 + 4000
    assert not q.budget_limited

    eng.clear()
    blocks = list(range(len(q.pieces)))
    pages = [16 + i for i in blocks]
    results = client.restore(inst, q.query, blocks, pages)
    assert all(r.ok for r in results), [r.error for r in results]
    for i, p in enumerate(q.pieces):
        assert eng.read(p.storage_group, 16 + i) == want[(p.storage_group, p.index)], p
        for other in SLOTS:  # no other group's page 16 + i was written
            if other != p.storage_group:
                assert not any(eng.read(other, 16 + i))
    client.unregister_instance(inst)


def test_hybrid_register_refuses_a_bad_or_disagreeing_description(client):
    eng = HybridEngine()
    with pytest.raises(orbitkv.InvalidArgumentError, match="window_tokens"):
        client.register_instance("hybrid-bad", 0, "host", eng.layout, eng.regions,
                                 model=description(window=0))
    d = description()
    d.groups[2].bytes = 4001  # the layout's group 2 holds 4000 bytes
    with pytest.raises(orbitkv.InvalidArgumentError):
        client.register_instance("hybrid-bad", 0, "host", eng.layout, eng.regions, model=d)
    with pytest.raises(TypeError):
        client.register_instance("hybrid-bad", 0, "host", eng.layout, eng.regions, model=3)
    # A dense instance of the same name shares nothing with the hybrid one.
    dense = orbitkv.split_layout(PAGES, [4096])
    regions = orbitkv.allocate_regions(dense)
    inst = client.register_instance("hybrid-bad", 0, "host", dense, regions)
    assert client.query(inst, 0, chain(4)).prefix == 0
