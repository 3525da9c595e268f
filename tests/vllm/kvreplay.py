"""A stand-in forward pass and a plan replayer for the connector's worker side.

No vLLM import: tests/vllm (CPU, host tensors) and tests/gpu/vllm_worker_gate.py
(CUDA tensors on a GPU host) share it.

The "forward" writes, for every token position j a request computes, the KV
row that a model would: a value that depends on the tokens 0..j only (a
SHA-256 chain over the token ids), different per layer and K/V. So a block
restored from the Manager must hold exactly the bytes the forward would have
written, and check_rows() proves that byte for byte.

The tensors come in vLLM's layouts: "kv_first" is the older per-layer
(2, num_blocks, block_size, heads, head_size); "block_first" is
(num_blocks, 2, block_size, heads, head_size); "hnd" is kv_first whose memory
is (2, num_blocks, heads, block_size, head_size) seen through permuted strides.

Hybrid models (a list of per-group specs, ``forward_groups`` / ``check_load``):
attention groups as above; a Mamba group (``"kind": "mamba"``) keeps per layer
and block the states of ``state_bytes`` (conv, SSM: mixed dtypes, as bytes).
Its stand-in forward is a real recurrence, as vLLM's in ``mamba_cache_mode
"align"``: the state after `start` tokens is read from the block holding it
(block ``(start - 1) // block_size``), advanced over the step's tokens, and
the state after `end` tokens is written to block ``cdiv(end, block_size) - 1``.
A state is the SHA-256 chain over the tokens (the first 32 bytes of each
state), expanded per layer and state; so a state restored wrong, or not at
all, makes every later state wrong.
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, List, Sequence

LAYOUTS = ("kv_first", "block_first", "hnd")


def row_hashes(tokens: Sequence[int]) -> List[bytes]:
    """h[j] depends on tokens[0..j] only."""
    out, h = [], b"\0" * 32
    for t in tokens:
        h = hashlib.sha256(h + int(t).to_bytes(8, "little", signed=True)).digest()
        out.append(h)
    return out


def make_kv_caches(spec: dict, device: str, allocate) -> Dict[str, object]:
    """Per-layer KV tensors: allocate(shape, dtype) returns a tensor on `device`."""
    import torch

    dtype = getattr(torch, spec["dtype"])
    nb, bs, h, d = spec["num_blocks"], spec["block_size"], spec["num_kv_heads"], spec["head_size"]
    out = {}
    for name in spec["layers"]:
        kind = spec["layout"]
        if kind == "kv_first":
            t = allocate((2, nb, bs, h, d), dtype)
        elif kind == "block_first":
            t = allocate((nb, 2, bs, h, d), dtype)
        elif kind == "hnd":
            t = allocate((2, nb, h, bs, d), dtype).permute(0, 1, 3, 2, 4)
        else:
            raise ValueError(f"unknown layout {kind}")
        out[name] = t
    return out


def row_index(spec: dict, kv: int, block: int, offset: int):
    """The index of the (heads, head_size) K (kv=0) or V row of a token at
    `offset` in `block`, in any of LAYOUTS."""
    if spec["layout"] == "block_first":
        return (block, kv, offset)
    return (kv, block, offset)


def block_rows(spec: dict, t, kv: int, block_ids: Sequence[int]):
    """The K or V rows of `block_ids` in order: (len * block_size, heads, head_size), a copy."""
    rows = t[list(block_ids), kv] if spec["layout"] == "block_first" else t[kv][list(block_ids)]
    return rows.reshape(-1, *rows.shape[2:])


def _row_value(h: bytes, layer: int, kv: int, n: int) -> bytes:
    seed = hashlib.sha256(h + bytes([layer, kv])).digest()
    return (seed * (n // 32 + 1))[:n]


def _rows(spec: dict, kv_caches: Dict[str, object], tokens: Sequence[int],
          block_ids: Sequence[int], start: int, end: int):
    """(label, row view, the forward's bytes) of every K and V row of [start, end)."""
    bs = spec["block_size"]
    hashes = row_hashes(tokens[:end])
    # "layer_ids": the layers' indices in the model (hybrid specs list one group's layers).
    for li, name in zip(spec.get("layer_ids", range(len(spec["layers"]))), spec["layers"]):
        t = kv_caches[name]
        row_bytes = t.shape[-2] * t.shape[-1] * t.element_size()
        for kv in (0, 1):
            for j in range(start, end):
                if block_ids[j // bs] == spec.get("null_block"):
                    continue  # a sliding window's block vLLM freed (or never gave)
                row = t[row_index(spec, kv, block_ids[j // bs], j % bs)]
                label = f"{name} {'KV'[kv]} token {j} (block {block_ids[j // bs]})"
                yield label, row, _row_value(hashes[j], li, kv, row_bytes)


def write_rows(spec: dict, kv_caches: Dict[str, object], tokens: Sequence[int],
               block_ids: Sequence[int], start: int, end: int) -> None:
    """The forward of positions [start, end) of a request with `tokens` in `block_ids`."""
    import torch

    for _, row, value in _rows(spec, kv_caches, tokens, block_ids, start, end):
        v = torch.frombuffer(bytearray(value), dtype=torch.uint8)
        row.copy_(v.view(row.dtype).view(row.shape))


def check_rows(spec: dict, kv_caches: Dict[str, object], tokens: Sequence[int],
               block_ids: Sequence[int], start: int, end: int) -> List[str]:
    """Positions of [start, end) whose KV rows differ from the forward's; [] if all match."""
    import torch

    return [label for label, row, value in _rows(spec, kv_caches, tokens, block_ids, start, end)
            if row.contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes() != value]


# ---- Mamba state (a recurrent KV cache group) ----------------------------------

_ZERO = b"\0" * 32


def _state_value(digest: bytes, layer: int, state: int, n: int) -> bytes:
    tail = hashlib.sha256(digest + bytes([layer, state])).digest()
    return (digest + tail * (n // 32 + 1))[:n]


def _states(spec: dict, kv_caches: Dict[str, object], name: str, block: int):
    """The (bytes,) uint8 views of layer `name`'s states in `block`."""
    from orbitkv.vllm.layout import state_views

    return [v[block] for v in state_views(kv_caches[name], spec["num_blocks"],
                                          spec["state_bytes"], name)]


def _state_block(spec: dict, block_ids: Sequence[int], tokens: int) -> int:
    """The block holding the state after `tokens` (> 0) tokens."""
    return block_ids[(tokens + spec["block_size"] - 1) // spec["block_size"] - 1]


def write_state(spec: dict, kv_caches: Dict[str, object], tokens: Sequence[int],
                block_ids: Sequence[int], start: int, end: int) -> None:
    """The forward of positions [start, end) of a Mamba group."""
    import torch

    if end <= start:
        return
    if start == 0:
        digest = _ZERO
    else:
        first = _states(spec, kv_caches, spec["layers"][0], _state_block(spec, block_ids, start))[0]
        digest = first[:32].cpu().numpy().tobytes()
    for t in tokens[start:end]:
        digest = hashlib.sha256(digest + int(t).to_bytes(8, "little", signed=True)).digest()
    dest = _state_block(spec, block_ids, end)
    for li, name in zip(spec["layer_ids"], spec["layers"]):
        for i, v in enumerate(_states(spec, kv_caches, name, dest)):
            value = _state_value(digest, li, i, v.numel())
            v.copy_(torch.frombuffer(bytearray(value), dtype=torch.uint8))


def check_state(spec: dict, kv_caches: Dict[str, object], tokens: Sequence[int],
                block_ids: Sequence[int], n: int) -> List[str]:
    """The states of a Mamba group's block for the prefix of `n` tokens that
    differ from the forward's (every layer, every state); [] if all match."""
    block = _state_block(spec, block_ids, n)
    if block == spec.get("null_block"):
        return [f"state after {n} tokens: no block"]
    digest = row_hashes(tokens[:n])[n - 1]
    bad = []
    for li, name in zip(spec["layer_ids"], spec["layers"]):
        for i, v in enumerate(_states(spec, kv_caches, name, block)):
            if v.cpu().numpy().tobytes() != _state_value(digest, li, i, v.numel()):
                bad.append(f"{name} state {i} after {n} tokens (block {block})")
    return bad


def make_mamba_hybrid_caches(attn: dict, mamba: dict, page_bytes: int, device: str,
                             allocate) -> Dict[str, object]:
    """vLLM's hybrid allocator for full attention + Mamba: per pair of layers
    (attn["layers"][i], mamba["layers"][i]) one buffer of num_blocks pages of
    `page_bytes`, seen by the attention layer as block-first KV
    (num_blocks, 2, block_size, heads, head_size) and by the Mamba layer as
    vLLM 0.33's raw state view (num_blocks, 1, 1, sum(state_bytes)) int8."""
    import torch

    nb = attn["num_blocks"]
    dtype = getattr(torch, attn["dtype"])
    kv_bytes = 2 * attn["block_size"] * attn["num_kv_heads"] * attn["head_size"] * dtype.itemsize
    content = sum(mamba["state_bytes"])
    if max(kv_bytes, content) > page_bytes:
        raise ValueError(f"page of {page_bytes} bytes < KV {kv_bytes} or state {content} bytes")
    out = {}
    for a, m in zip(attn["layers"], mamba["layers"]):
        raw = allocate((nb * page_bytes,), torch.int8)
        kv = raw.view(dtype).as_strided(
            (nb, 2, attn["block_size"], attn["num_kv_heads"], attn["head_size"]),
            (page_bytes // dtype.itemsize, kv_bytes // 2 // dtype.itemsize,
             attn["num_kv_heads"] * attn["head_size"], attn["head_size"], 1))
        out[a] = kv
        out[m] = raw.as_strided((nb, 1, 1, content), (page_bytes, content, content, 1))
    return out


def forward_groups(specs: Sequence[dict], kv_caches: Dict[str, object], tokens: Sequence[int],
                   group_block_ids: Sequence[Sequence[int]], start: int, end: int) -> None:
    """The forward of [start, end) in every KV cache group of a hybrid model."""
    for sp, ids in zip(specs, group_block_ids):
        if sp.get("kind") == "mamba":
            write_state(sp, kv_caches, tokens, ids, start, end)
        else:
            write_rows(sp, kv_caches, tokens, ids, start, end)


def check_groups(specs: Sequence[dict], kv_caches: Dict[str, object], tokens: Sequence[int],
                 group_block_ids: Sequence[Sequence[int]], start: int, end: int) -> List[str]:
    """What differs from the forward after `end` tokens: attention rows of
    [start, end) (a window's null blocks skipped), a Mamba group's state."""
    bad = []
    for sp, ids in zip(specs, group_block_ids):
        if sp.get("kind") == "mamba":
            bad += check_state(sp, kv_caches, tokens, ids, end) if end else []
        else:
            bad += check_rows(sp, kv_caches, tokens, ids, start, min(end, len(ids) * sp["block_size"]))
    return bad


def mamba_worker_inputs(recording: dict, device: str, allocate):
    """(KV tensors, KVLayout, ModelDescription) of a full attention + Mamba
    recording (spec "groups" [attention, mamba]): fresh tensors in vLLM's
    layouts on `device`, registered as the connector's worker registers them."""
    from orbitkv.hybrid import ModelDescription
    from orbitkv.vllm.layout import describe_kv_caches

    spec = recording["spec"]
    attn, mamba = spec["groups"]
    kv = make_mamba_hybrid_caches(attn, mamba, spec["page_bytes"], device, allocate)
    groups = {n: g for g, sp in enumerate(spec["groups"]) for n in sp["layers"]}
    layout = describe_kv_caches(kv, spec["num_blocks"], groups, {1: mamba["state_bytes"]})
    return kv, layout, ModelDescription.from_dict(spec["description"])


class Recording:
    """Steps of a scheduler-driven run, for replay without vLLM: per step the
    plan (JSON), the forward's writes, and the loads to check once finished."""

    def __init__(self, spec: dict, namespace: str) -> None:
        self.data = {"spec": dict(spec), "namespace": namespace, "steps": []}

    def step(self, plan_json: dict, writes: List[dict], checks: List[dict]) -> None:
        self.data["steps"].append({"plan": plan_json, "writes": writes, "checks": checks})

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
            f.write("\n")


def first_load_step(recording: dict) -> int:
    """The index of the first step that loads anything (len(steps) if none)."""
    steps = recording["steps"]
    return next((i for i, s in enumerate(steps) if s["plan"]["loads"]), len(steps))


def replay(recording: dict, core, kv_caches: Dict[str, object], ready=None,
           timeout_s: float = 60.0, layout: str = "", forward=None, check=None,
           steps: slice = slice(None)) -> dict:
    """Drives an orbitkv.vllm.worker.WorkerCore through a recording.

    Per step: handle_preemptions, start_load, the forward's writes, save
    (`ready` runs first on the saver thread, e.g. a CUDA synchronize), then
    get_finished until the step's checked loads finished; each check compares
    the loaded rows byte for byte. Returns counts; raises AssertionError on a
    wrong byte or a load error. `layout` names the tensors' layout when it is
    not the recorded one. `forward(write)` replaces the stand-in forward
    (write_rows) and `check(check)` the row check (check_rows; it returns the
    labels of wrong rows), e.g. a real model's; `steps` replays a part of the
    recording (a second instance taking over from first_load_step()).
    """
    import time

    from orbitkv.vllm.plan import StepPlan

    spec = dict(recording["spec"], **({"layout": layout} if layout else {}))
    groups = spec.get("groups")  # a hybrid recording: per-group specs and block ids
    if forward is None:
        def forward(w):
            if groups:
                forward_groups(groups, kv_caches, w["tokens"], w["block_ids"], w["start"], w["end"])
            else:
                write_rows(spec, kv_caches, w["tokens"], w["block_ids"], w["start"], w["end"])
    if check is None:
        def check(c):
            if groups:
                return check_groups(groups, kv_caches, c["tokens"], c["block_ids"], c["start"],
                                    c["end"])
            return check_rows(spec, kv_caches, c["tokens"], c["block_ids"], c["start"], c["end"])
    checked = restored_steps = 0
    received: set = set()  # loads may finish earlier than in the recorded run
    chosen = list(enumerate(recording["steps"]))[steps]
    for i, step in chosen:
        plan = StepPlan.from_json(step["plan"])
        core.handle_preemptions(plan)
        core.start_load(plan)
        core.wait_for_layer_load()
        for w in step["writes"]:
            forward(w)
        core.save(plan, ready)
        want = {c["req_id"] for c in step["checks"]}
        deadline = time.monotonic() + timeout_s
        while True:
            _, recving = core.get_finished()
            received |= recving
            if want <= received:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"step {i}: loads of {sorted(want - received)} did not finish")
            time.sleep(0.005)
        errors = core.take_load_errors()
        if errors:
            raise AssertionError(f"step {i}: load errors in blocks {sorted(errors)}")
        failed = core.take_failed_loads(want)
        if failed:
            raise AssertionError(f"step {i}: the loads of {sorted(failed)} failed")
        for c in step["checks"]:
            bad = check(c)
            if bad:
                raise AssertionError(f"step {i}: {c['req_id']}: {len(bad)} wrong rows, first {bad[:3]}")
            checked += c["end"] - c["start"]
        restored_steps += bool(step["checks"])
        if not core.wait_for_saves(timeout_s):
            raise AssertionError(f"step {i}: saves did not finish in {timeout_s} s")
    return {"steps": len(chosen), "checked_tokens": checked, "load_steps": restored_steps}
