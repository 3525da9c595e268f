"""orbitkv.hybrid against the C++ library (src/recovery, through orbitkv-recovery-tool):
the same refusals with the same messages, the same canonical bytes, fingerprints,
group masks and object keys, for hand-written and random descriptions (valid
and broken one field at a time). Engine-free; the engine mappings are tested in
tests/vllm/test_hybrid_mapping.py and tests/sglang/test_hybrid_mapping.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from orbitkv.hybrid import (
    GroupDescription,
    GroupKind,
    ModelDescription,
    block_key_index,
    checkpoint_key_index,
    group_mask,
    object_key,
)

REPO = Path(__file__).resolve().parents[2]
TOOL = os.environ.get("ORBITKV_RECOVERY_TOOL") or str(
    REPO / "build" / "src" / "recovery" / "orbitkv-recovery-tool")

F, W, R = GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.RECURRENT


def hybrid() -> ModelDescription:
    return ModelDescription(16, [
        GroupDescription("attn", F, 0, 16, 1 << 20),
        GroupDescription("swa", W, 1, 32, 1 << 19, window_tokens=4096),
        GroupDescription("gdn", R, 2, 16, 37 << 20, checkpoint_positions=[256, 512, 4096]),
    ])


def run_tool(cases):
    if not os.path.exists(TOOL):
        pytest.skip(f"the C++ side is not built ({TOOL}; cmake --build build --target "
                    "orbitkv-recovery-tool)")
    payload = {"cases": [{"model": d.to_dict(), "chain": [k.hex() for k in chain]}
                         for d, chain in cases]}
    out = subprocess.run([TOOL], input=json.dumps(payload), capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def python_side(d: ModelDescription, chain):
    try:
        d.validate()
    except ValueError as e:
        return {"error": str(e)}
    masks = [group_mask(g) for g in d.groups]
    return {
        "canonical": d.canonical_bytes().hex(),
        "fingerprint": d.fingerprint().hex(),
        "masks": [m.hex() for m in masks],
        "object_keys": [[object_key(k, m).hex() for k in chain] for m in masks],
    }


def broken(d: ModelDescription, rng: random.Random) -> ModelDescription:
    """d with one field set to something the rules refuse (or, by chance, allow)."""
    d = copy.deepcopy(d)
    g = rng.choice(d.groups)
    edit = rng.randrange(14)
    if edit == 0:
        g.window_tokens = 0 if g.kind == W else 5
    elif edit == 1:
        g.name = rng.choice(["", "a b", "x" * 129, "t\x01", 'q"\\', d.groups[0].name])
    elif edit == 2:
        g.kind = rng.choice([0, 4, 200])
    elif edit == 3:
        g.storage_group = rng.choice([64, 1000, d.groups[0].storage_group])
    elif edit == 4:
        g.block_tokens = rng.choice([0, d.key_block_tokens * 3 + 1, 1 << 21])
    elif edit == 5:
        g.bytes = rng.choice([0, (1 << 36) + 1])
    elif edit == 6:
        g.checkpoint_interval_tokens = rng.choice([0, 7, g.block_tokens * 2, (1 << 32) + 16])
    elif edit == 7:
        g.checkpoint_positions = rng.choice([[0], [g.block_tokens + 1], [64, 32], [32, 32],
                                             [g.block_tokens * 2]])
    elif edit == 8:
        d.groups = []
    elif edit == 9:
        d.key_block_tokens = rng.choice([0, 1 << 21, 3])
    elif edit == 10:
        d.groups = d.groups * 33
    elif edit == 11:
        g.window_tokens = (1 << 32) + 1
    elif edit == 12:
        g.checkpoint_positions = [16 * (i + 1) for i in range((1 << 16) + 1)]
    else:
        g.checkpoint_positions, g.checkpoint_interval_tokens = [], 0
    return d


def random_description(rng: random.Random) -> ModelDescription:
    kb = rng.choice([1, 4, 16, 64])
    groups = []
    for i in range(rng.randint(1, 5)):
        kind = rng.choice([F, W, R])
        bt = kb * rng.choice([1, 1, 2, 3])
        g = GroupDescription(rng.choice(["attn", "swa", "gdn", "conv", "mla.kv", "L0-23:k"]) + str(i),
                             kind, rng.randrange(64) if rng.random() < 0.2 else i, bt,
                             rng.randint(1, 1 << 36))
        if kind == W:
            g.window_tokens = rng.randint(1, 1 << 20)
        if kind == R:
            if rng.random() < 0.5:
                g.checkpoint_interval_tokens = bt * rng.randint(1, 64)
            else:
                g.checkpoint_positions = sorted(rng.sample(range(1, 200), rng.randint(1, 10)))
                g.checkpoint_positions = [p * bt for p in g.checkpoint_positions]
        groups.append(g)
    return ModelDescription(kb, groups)


def test_hand_written_descriptions_match_cpp():
    chain = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
    cases = [(hybrid(), chain), (ModelDescription(16, [GroupDescription("attn", F, 0, 16, 1)]), [])]
    rng = random.Random(7)
    cases += [(broken(hybrid(), rng), chain) for _ in range(200)]
    got = run_tool(cases)
    assert len(got) == len(cases)
    errors = 0
    for (d, c), cpp in zip(cases, got):
        assert python_side(d, c) == cpp, d
        errors += "error" in cpp
    assert errors > 150  # the broken ones are refused, on both sides alike


def test_random_descriptions_match_cpp():
    seed = int(os.environ.get("ORBITKV_HYBRID_SEED", "20261201"))
    rng = random.Random(seed)
    cases = []
    for _ in range(300):
        d = random_description(rng)
        if rng.random() < 0.4:
            d = broken(d, rng)
        chain = [rng.randbytes(32) for _ in range(rng.randint(0, 4))]
        cases.append((d, chain))
    got = run_tool(cases)
    valid = 0
    for i, ((d, c), cpp) in enumerate(zip(cases, got)):
        assert python_side(d, c) == cpp, f"case {i} of seed {seed}: {d}"
        valid += "error" not in cpp
    assert 100 < valid < 300


def test_messages_name_the_field():
    d = hybrid()
    d.groups[1].window_tokens = 0
    with pytest.raises(ValueError, match=r"^model\.groups\[1\]\.window_tokens: 0"):
        d.validate()
    d = hybrid()
    d.groups[2].checkpoint_positions = [256, 500]
    with pytest.raises(ValueError, match=r"^model\.groups\[2\]\.checkpoint_positions\[1\]: 500 "
                       r"is off the block grid"):
        d.validate()
    d = hybrid()
    d.groups[2].name = "attn"
    with pytest.raises(ValueError, match=r'names two groups'):
        d.validate()
    with pytest.raises(ValueError, match=r"^model\.groups: no groups"):
        ModelDescription(16, []).validate()
    with pytest.raises(ValueError, match=r"^model\.groups\[0\]\.bytes: 0 is outside"):
        ModelDescription(16, [GroupDescription("a", F, 0, 16, 0)]).validate()


def test_fingerprint_ignores_group_order():
    a, b = hybrid(), hybrid()
    b.groups.reverse()
    assert a.fingerprint() == b.fingerprint()
    b.groups[0].bytes += 1
    assert a.fingerprint() != b.fingerprint()


def test_key_derivation():
    d = ModelDescription(16, [GroupDescription("attn", F, 0, 64, 1),
                              GroupDescription("r", R, 1, 32, 1, checkpoint_interval_tokens=32)])
    assert block_key_index(d, d.groups[0], 0) == 3
    assert block_key_index(d, d.groups[0], 2) == 11
    assert checkpoint_key_index(d, 32) == 1
    # The documented formula, and the constant the C++ test pins.
    assert group_mask(GroupDescription("attn", F, 0, 16, 1)).hex() == (
        "10e2404093749c5a01495f0527b76030e0204f3a0585a2297d736e23aa4b82f6")
    k = bytes(range(32))
    m = group_mask(d.groups[1])
    assert object_key(object_key(k, m), m) == k
    assert object_key(k, m) != object_key(k, group_mask(d.groups[0]))
    with pytest.raises(ValueError):
        object_key(b"short", m)
