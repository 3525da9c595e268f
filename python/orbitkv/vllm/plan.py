"""What the scheduler side tells the worker side for one step (no vLLM import).

A :class:`StepPlan` is the payload of the connector metadata vLLM hands from
the scheduler to every worker: which requests load which keys into which
blocks, which computed blocks to publish under which keys, and which finished
requests keep their blocks until this worker's saves and loads are done.
It round-trips through JSON (keys as hex) so a recorded plan can be replayed
without vLLM, e.g. on a GPU host by tests/gpu/vllm_worker_gate.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import List, Optional


@dataclasses.dataclass
class LoadSpec:
    """A load. One KV cache group: `keys` name the blocks to restore and
    `block_ids` their destinations, one per key. Hybrid (`group_block_ids`
    set): `keys` is the request's chain from block 0 up to the hit's end
    (`prefix_tokens`), the worker queries it and restores the recovery plan's
    pieces into `group_block_ids[storage group]`, except attention blocks
    below `skip_blocks` (vLLM's local hit); `block_ids` is empty."""

    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    group_block_ids: Optional[List[List[int]]] = None  # per KV cache group: the request's blocks
    skip_blocks: int = 0
    prefix_tokens: int = 0
    null_block: int = 0  # vLLM's null block id: no block allocated there

    @property
    def hybrid(self) -> bool:
        return self.group_block_ids is not None


@dataclasses.dataclass
class SaveSpec:
    req_id: str
    keys: List[bytes]  # chain keys of complete blocks computed in this step or before
    block_ids: List[int]  # source vLLM block per key
    group: int = 0  # the KV cache group (storage group) the blocks belong to


@dataclasses.dataclass
class StepPlan:
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    # Finished requests whose blocks vLLM keeps until the worker reports them
    # in finished_sending (their saves, or a load still writing their blocks).
    delayed_free: List[str] = dataclasses.field(default_factory=list)
    # Requests vLLM preempted since the last step: their blocks go to others
    # in this step, so their saves in flight must finish first.
    preempted: List[str] = dataclasses.field(default_factory=list)
    sync_load: bool = False  # wait_for_layer_load blocks until this step's loads are done

    def empty(self) -> bool:
        return not (self.loads or self.saves or self.delayed_free or self.preempted)

    def to_json(self) -> dict:
        def spec(s):
            d = {"req_id": s.req_id, "keys": [k.hex() for k in s.keys],
                 "block_ids": list(s.block_ids)}
            if getattr(s, "group", 0):
                d["group"] = s.group
            if getattr(s, "group_block_ids", None) is not None:
                d["group_block_ids"] = [list(g) for g in s.group_block_ids]
                d["skip_blocks"] = s.skip_blocks
                d["prefix_tokens"] = s.prefix_tokens
                d["null_block"] = s.null_block
            return d

        return {
            "loads": [spec(s) for s in self.loads],
            "saves": [spec(s) for s in self.saves],
            "delayed_free": list(self.delayed_free),
            "preempted": list(self.preempted),
            "sync_load": self.sync_load,
        }

    @staticmethod
    def from_json(d: dict) -> "StepPlan":
        def spec(cls, s):
            keys = [bytes.fromhex(k) for k in s["keys"]]
            ids = [int(b) for b in s["block_ids"]]
            extra = {}
            if "group" in s:
                extra["group"] = int(s["group"])
            if "group_block_ids" in s:
                extra["group_block_ids"] = [[int(b) for b in g] for g in s["group_block_ids"]]
                extra["skip_blocks"] = int(s.get("skip_blocks", 0))
                extra["prefix_tokens"] = int(s.get("prefix_tokens", 0))
                extra["null_block"] = int(s.get("null_block", 0))
            elif len(keys) != len(ids):
                raise ValueError(f"plan for {s['req_id']}: {len(keys)} keys but {len(ids)} blocks")
            return cls(str(s["req_id"]), keys, ids, **extra)

        return StepPlan(
            loads=[spec(LoadSpec, s) for s in d.get("loads", [])],
            saves=[spec(SaveSpec, s) for s in d.get("saves", [])],
            delayed_free=[str(r) for r in d.get("delayed_free", [])],
            preempted=[str(r) for r in d.get("preempted", [])],
            sync_load=bool(d.get("sync_load", False)),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json())
